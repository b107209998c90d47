"""pytest plugin (``-p suite_cpu_plugin``, with ``benchmarks/`` on ``PYTHONPATH``): per test, the CPU seconds of
the worker itself and of the child processes it reaped during the test, its wall time and its gc time, one JSON
line each to ``$SUITE_CPU_OUT``; at the end of each worker's session a ``SESSION_END`` line with the worker's
totals. Used by :mod:`suite_cost`. A child reaped later than the test that started it (a session fixture's
server, the e2e stack stopped after its last test) is counted on the test that reaped it."""

from __future__ import annotations

import gc
import json
import os
import resource
import time

import pytest

_OUT = os.environ.get("SUITE_CPU_OUT", "suite_cpu.jsonl")
_gc = {"t": 0.0, "start": None}


def _on_gc(phase, info):
    if phase == "start":
        _gc["start"] = time.perf_counter()
    elif _gc["start"] is not None:
        _gc["t"] += time.perf_counter() - _gc["start"]
        _gc["start"] = None


gc.callbacks.append(_on_gc)


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def _write(row: dict) -> None:
    with open(_OUT, "a") as fh:
        fh.write(json.dumps(row) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    s0, c0 = _cpu()
    t0, g0 = time.time(), _gc["t"]
    yield
    s1, c1 = _cpu()
    _write({"id": item.nodeid, "w": os.environ.get("PYTEST_XDIST_WORKER"), "self": s1 - s0, "children": c1 - c0,
            "start": t0, "end": time.time(), "gc": _gc["t"] - g0})


def pytest_sessionfinish(session):
    s, c = _cpu()
    _write({"id": "SESSION_END", "w": os.environ.get("PYTEST_XDIST_WORKER"), "self": s, "children": c,
            "end": time.time(), "gc": _gc["t"]})
