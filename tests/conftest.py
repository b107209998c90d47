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

import boto3
from hypothesis import settings

from gpufleet.store.clients import botocore_session

settings.register_profile("gpufleet", deadline=None)
settings.load_profile("gpufleet")


def _default_session_sharing_the_loader(**kwargs) -> None:
    """``boto3.setup_default_session`` with the process's one botocore data loader (gpufleet.store.clients).

    moto's ``mock_aws`` sets ``boto3.DEFAULT_SESSION`` to None while it is active, so each test's first
    ``boto3.client`` built a new default session whose new loader parsed the service models and endpoint rules
    again (~0.1-0.2 s a test; 16 % of the CPU of the store and API tests). Sessions still get their own
    credentials, from the environment the test set."""
    kwargs.setdefault("botocore_session", botocore_session())
    boto3.DEFAULT_SESSION = boto3.Session(**kwargs)


boto3.setup_default_session = _default_session_sharing_the_loader


def pytest_collection_finish(session) -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 5)
