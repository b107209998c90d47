"""Contract of :class:`gpufleet.store.lease.Lease` (the scheduler's one-pass lease), on the fake and on moto.

Taken only when nobody holds it or the holder's lease ran out; given back only by its holder.
"""

from __future__ import annotations

NOW = 1_780_000_000.0


def test_one_holder_at_a_time_until_the_lease_runs_out(backend):
    lease = backend.lease
    assert lease.acquire("a", NOW, 30) is True
    assert lease.acquire("b", NOW + 10, 30) is False
    assert lease.acquire("a", NOW + 10, 30) is False  # not re-entrant: the holder waits for its own lease too
    assert lease.acquire("b", NOW + 31, 30) is True  # expired: taken over
    assert lease.acquire("a", NOW + 40, 30) is False


def test_only_the_holder_gives_it_back(backend):
    lease = backend.lease
    assert lease.acquire("a", NOW, 30) is True
    lease.release("b")  # not b's: nothing happens
    assert lease.acquire("b", NOW + 1, 30) is False
    lease.release("a")
    assert lease.acquire("b", NOW + 2, 30) is True
    lease.release("nobody")
    lease.release("b")
    lease.release("b")  # releasing a lease nobody holds does nothing either
    assert lease.acquire("c", NOW + 3, 30) is True
