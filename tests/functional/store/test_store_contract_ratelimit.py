"""Contract of :class:`gpufleet.store.ratelimit.RateLimitStore`, on the fake and on moto."""

from __future__ import annotations

import random
import threading

import pytest

from gpufleet.store.ratelimit import decide

NOW = 1_780_000_000.0


def test_a_full_bucket_allows_its_burst_then_one_per_interval(backend):
    rl = backend.rate_limits
    assert [rl.take("t1", rate=2, burst=3, now=NOW) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = rl.take("t1", rate=2, burst=3, now=NOW)
    assert wait == pytest.approx(0.5, abs=1e-3)
    assert rl.take("t1", rate=2, burst=3, now=NOW + 0.25) == pytest.approx(0.25, abs=1e-3)
    assert rl.take("t1", rate=2, burst=3, now=NOW + 0.5) == 0.0  # one token back after 1/rate
    assert rl.take("t1", rate=2, burst=3, now=NOW + 0.5) > 0
    # another tenant's bucket is its own
    assert [rl.take("t2", rate=2, burst=3, now=NOW + 0.5) for _ in range(3)] == [0.0] * 3
    # idle long enough, the bucket is full again (and never holds more than the burst)
    later = NOW + 100
    assert [rl.take("t1", rate=2, burst=3, now=later) == 0.0 for _ in range(4)] == [True, True, True, False]


def test_refusals_spend_nothing(backend):
    rl = backend.rate_limits
    assert rl.take("t1", rate=1, burst=1, now=NOW) == 0.0
    for _ in range(5):
        assert rl.take("t1", rate=1, burst=1, now=NOW + 0.5) == pytest.approx(0.5, abs=1e-3)
    assert rl.take("t1", rate=1, burst=1, now=NOW + 1.0) == 0.0


def test_agrees_with_the_pure_decision_on_random_traffic(backend):
    rng = random.Random(15)
    tat: dict[str, float | None] = {"a": None, "b": None}
    now = NOW
    for _ in range(120):
        now += rng.choice([0.0, 0.0, 0.01, 0.1, 0.3, 2.0])
        tenant = rng.choice(["a", "b"])
        allowed, new, wait = decide(tat[tenant], now, 5, 4)
        if allowed:
            tat[tenant] = new
        got = backend.rate_limits.take(tenant, rate=5, burst=4, now=now)
        assert (got == 0.0) == allowed, (tenant, now)
        if not allowed:
            assert got == pytest.approx(wait, abs=1e-3)


def test_concurrent_takes_never_overspend(backend):
    rl, results = backend.rate_limits, []
    barrier = threading.Barrier(16)

    def go():
        barrier.wait()
        got = [rl.take("t1", rate=1, burst=10, now=NOW) for _ in range(3)]
        results.extend(got)

    threads = [threading.Thread(target=go) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for w in results if w == 0.0) == 10
