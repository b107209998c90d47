"""The runner's init phase (:meth:`LambdaRunner.initialize`): a handler module's ``init()`` runs ahead of the first
event with the function's environment, and the first invocation then finds the container warm (no cold start in
between); a module without ``init()``, and a function run in worker processes, are left alone."""

from __future__ import annotations

import os
import sys
import types
from functools import lru_cache
from types import SimpleNamespace

import pytest

from gpufleet.local import lambda_runner
from gpufleet.local.lambda_runner import LambdaRunner


def _module(name: str, with_init: bool) -> types.ModuleType:
    module = types.ModuleType(name)
    module.loads = []

    @lru_cache(maxsize=1)
    def model() -> str:  # what a container caches: loaded once per container
        module.loads.append(os.environ.get("GPUFLEET_POLICY"))
        return f"model({os.environ.get('GPUFLEET_POLICY')})"

    model.__module__ = name
    module.model = model
    module.handler = lambda event, context: {"model": model()}
    if with_init:
        module.init = model
    return module


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(lambda_runner, "_SERVED", {})
    r = LambdaRunner({}, endpoint_url="http://127.0.0.1:1", isolated={"finalize"})
    monkeypatch.setattr(r, "_verify_handler", lambda asset, module: None)
    monkeypatch.setattr(r, "asset_dir", lambda fn: None)
    return r


def _fn(module: str, key: str = "check_prompt") -> SimpleNamespace:
    return SimpleNamespace(function_name=key, function_arn=f"arn:aws:lambda:us-east-1:1:function:{key}",
                           handler=f"{module}.handler", environment_vars={"GPUFLEET_FUNCTION": key,
                                                                          "GPUFLEET_POLICY": "deployed"},
                           memory_size=128, timeout=3, logs_group_name="", code={}, run_time="python3.11")


def test_init_runs_with_the_functions_environment_and_the_first_invocation_finds_it_warm(runner, monkeypatch):
    mod = _module("lambdas.fake_init", with_init=True)
    monkeypatch.setitem(sys.modules, "lambdas.fake_init", mod)
    assert runner.initialize(_fn("lambdas.fake_init")) is True
    assert mod.loads == ["deployed"]  # the function's environment, not this process's
    assert os.environ.get("GPUFLEET_POLICY") is None
    assert '"model(deployed)"' in runner(_fn("lambdas.fake_init"), {})[0]
    assert mod.loads == ["deployed"]  # loaded once: no cold start between the init and the first event


def test_a_module_without_init_and_an_isolated_function_are_left_alone(runner, monkeypatch):
    plain = _module("lambdas.fake_plain", with_init=False)
    monkeypatch.setitem(sys.modules, "lambdas.fake_plain", plain)
    assert runner.initialize(_fn("lambdas.fake_plain")) is False
    isolated = _module("lambdas.fake_isolated", with_init=True)
    monkeypatch.setitem(sys.modules, "lambdas.fake_isolated", isolated)
    assert runner.initialize(_fn("lambdas.fake_isolated", key="finalize")) is False  # its workers start their own
    assert plain.loads == [] and isolated.loads == []


def test_the_check_prompt_function_has_an_init_phase():
    from lambdas.tasks import check_prompt

    assert callable(check_prompt.init)
