"""Suite-wide settings of the test processes (pytest and its xdist workers).

Garbage collection: a worker's heap is large (moto's backends, synthesized templates, the ML libraries), and
Python's full collections scanned all of it again and again: measured on tests/unit, tests/infra and two
functional folders (`-n 2`), the two workers spent 46 s and 29 s of their 215 s in the collector, 64 s of it in
full collections. Once collection is done, everything alive (modules, test items, fixtures' code) is moved out
of the collector's reach (`gc.freeze`), and young collections run less often, so a full one comes about every
five million allocations instead of every seventy thousand. Cyclic garbage is still collected.

Hypothesis: no per-example deadline suite-wide (the `gpufleet` profile). Its default 200 ms deadline is a
timing assertion; on a shared two-core machine under load a property test of pure logic failed on it once
(tests/unit/nodeapi/test_nodeapi_assignment.py, passing alone). Performance lives in benchmarks/, not tests;
tests that set their own `settings(deadline=...)` keep them.
"""

from __future__ import annotations

import gc

from hypothesis import settings

settings.register_profile("gpufleet", deadline=None)
settings.load_profile("gpufleet")


def pytest_collection_finish(session) -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 5)
