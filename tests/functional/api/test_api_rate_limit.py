"""Per-tenant request rate limits under load, over loopback through the signed local gateway.

Tenant t1 (alice) floods the API from 8 threads through two gateways, each with its own API
instance (two "containers" sharing the control table's bucket), while tenant t2 (carol) sends a
steady trickle below its own limit. t1 is throttled (429 rate-limited, Retry-After) to what its
bucket allows across both containers; every t2 request succeeds. Bounded: at most 400 requests
and 3-20 s of load (until t1 has been refused).
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from api_helpers import ALICE, CAROL, KEYS, REGION, signed_request

from gpufleet.clock import SystemClock

pytestmark = pytest.mark.xdist_group("api-rate-limit")

#: a limit a loaded 2-core host still floods past (8 threads there offer as little as 3 req/s)
RATE, BURST = 1.0, 4
LOAD_S = 3.0
#: the flood goes on past LOAD_S until t1 has been refused at least once, up to this long
LOAD_MAX_S = 20.0
FLOOD_MAX = 360


@pytest.fixture
def clock():
    return SystemClock()


@pytest.fixture
def settings_kw():
    # t2 gets its own (larger) limit through the per-tenant overrides
    return {"tenant_rate_limit": RATE, "tenant_burst_limit": BURST,
            "tenant_rate_limits": {"t2": {"rate": 50, "burst": 20}}}


@pytest.fixture
def gateways(deps):
    from gpufleet.api.app import Api
    from gpufleet.devstack.gateway import Gateway, LocalCredential

    creds = [LocalCredential(access_key_id=a, secret_access_key=s, principal_arn=arn) for arn, (a, s) in KEYS.items()]
    with Gateway(lambda: Api(deps).handle, creds, region=REGION) as g1, \
            Gateway(lambda: Api(deps).handle, creds, region=REGION) as g2:
        yield g1, g2


def test_a_flooding_tenant_is_throttled_while_another_is_served(gateways, deps, capsys):
    g1, g2 = gateways
    stop = threading.Event()
    flood: list[tuple[float, int, dict]] = []
    trickle: list[int] = []
    sent = iter(range(FLOOD_MAX))
    lock = threading.Lock()

    def flooder(i: int) -> None:
        gw = (g1, g2)[i % 2]
        while not stop.is_set():
            with lock:
                if next(sent, None) is None:
                    return
            r = signed_request("GET", f"{gw.url}/v1/jobs?limit=1", arn=ALICE)
            flood.append((time.monotonic(), r.status_code, dict(r.headers) | {"_body": r.text}))

    def trickler() -> None:
        for i in range(int(LOAD_S * 4)):  # 4/s: well inside t2's 50/s
            r = signed_request("GET", f"{(g1, g2)[i % 2].url}/v1/jobs?limit=1", arn=CAROL)
            trickle.append(r.status_code)
            time.sleep(0.25)

    start = time.monotonic()
    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(flooder, i) for i in range(8)] + [pool.submit(trickler)]
        time.sleep(LOAD_S)
        while time.monotonic() - start < LOAD_MAX_S and not any(s == 429 for _, s, _ in list(flood)):
            time.sleep(0.1)
        stop.set()
        for f in futures:
            f.result(timeout=60)
    elapsed = time.monotonic() - start

    ok = [f for f in flood if f[1] == 200]
    limited = [f for f in flood if f[1] == 429]
    summary = (
        f"rate-limit load: {elapsed:.2f} s; t1 sent {len(flood)}: {len(ok)} ok, {len(limited)} 429 "
        f"({len(flood) / elapsed:.0f} req/s offered, {len(ok) / elapsed:.1f} req/s served, limit {RATE:g}/s "
        f"burst {BURST}); t2 sent {len(trickle)}: {trickle.count(200)} ok"
    )
    with capsys.disabled():
        print("\n" + summary)
    assert trickle and set(trickle) == {200}, summary  # every t2 request succeeded
    assert {s for _, s, _ in flood} <= {200, 429}
    assert limited, summary
    # both containers spent one bucket: at most the burst plus what refills while the load ran
    assert len(ok) <= BURST + math.ceil(RATE * elapsed) + 2
    assert len(ok) >= BURST  # and the burst itself was served
    for _, _, h in limited[:20]:
        assert h["Content-Type"] == "application/problem+json"
        assert 1 <= int(h["Retry-After"]) <= 2
        assert '"rate-limited"' in h["_body"] or "/rate-limited" in h["_body"]
    # once the flood stops, t1's bucket refills and it is served again
    time.sleep(1.0 / RATE * 2)
    assert signed_request("GET", f"{g1.url}/v1/jobs?limit=1", arn=ALICE).status_code == 200
    out = capsys.readouterr().out
    assert '"RateLimited"' in out and '"ServerErrors"' not in out
