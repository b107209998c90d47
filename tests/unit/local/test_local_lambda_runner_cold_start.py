"""A handler module serving another deployment's function starts cold (no settings cached from the
first stack's environment), as a new Lambda container would."""

from __future__ import annotations

import sys
import types
from functools import lru_cache
from types import SimpleNamespace

from gpufleet.local import lambda_runner
from gpufleet.local.lambda_runner import LambdaRunner, cold_start


def _fake_handler_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    env = {"arn": "first"}

    @lru_cache(maxsize=1)
    def settings() -> str:
        return env["arn"]

    settings.__module__ = name
    module.settings = settings
    module.env = env
    module._api = object()
    module.__container__ = ("_api",)
    module.handler = lambda event, context: {"served": settings()}
    return module


def test_cold_start_clears_the_caches_and_container_singletons_of_handler_modules(monkeypatch):
    mod = _fake_handler_module("lambdas.fake_cold")
    monkeypatch.setitem(sys.modules, "lambdas.fake_cold", mod)
    assert mod.settings() == "first"
    mod.env["arn"] = "second"
    assert mod.settings() == "first"  # cached, as in one container
    assert cold_start() >= 2
    assert mod.settings() == "second" and mod._api is None


def test_the_runner_starts_a_module_cold_when_it_serves_another_function(monkeypatch):
    mod = _fake_handler_module("lambdas.fake_runner")
    monkeypatch.setitem(sys.modules, "lambdas.fake_runner", mod)
    runner = LambdaRunner({})
    monkeypatch.setattr(runner, "_verify_handler", lambda asset, module: None)
    monkeypatch.setattr(runner, "asset_dir", lambda fn: None)
    monkeypatch.setattr(lambda_runner.LambdaRunner, "handler_name", classmethod(lambda cls, fn: "lambdas.fake_runner.handler"))

    def fn(arn: str):
        return SimpleNamespace(function_name="f", function_arn=arn, environment_vars={}, memory_size=128, timeout=3,
                               logs_group_name="/aws/lambda/f", run_time="python3.11")

    assert '"first"' in runner(fn("arn:1"), {})[0]
    mod.env["arn"] = "second"
    assert '"first"' in runner(fn("arn:1"), {})[0]  # the same function: its container keeps its cache
    assert '"second"' in runner(fn("arn:2"), {})[0]  # another deployment's function: a cold start
    mod.env["arn"] = "third"
    fresh = LambdaRunner({})  # a runner for yet another stack, in the same process
    monkeypatch.setattr(fresh, "_verify_handler", lambda asset, module: None)
    monkeypatch.setattr(fresh, "asset_dir", lambda fn: None)
    assert '"third"' in fresh(fn("arn:3"), {})[0]


def test_a_module_used_directly_before_the_runner_first_serves_it_starts_cold(monkeypatch):
    """A test that called a handler module in-process (its own settings cached) must not leak them into the
    first invocation of a deployed function: the survey's API Lambda kept another test's watermark keys."""
    mod = _fake_handler_module("lambdas.fake_direct")
    monkeypatch.setitem(sys.modules, "lambdas.fake_direct", mod)
    monkeypatch.setattr(lambda_runner, "_SERVED", {})
    assert mod.handler({}, None) == {"served": "first"}  # used directly: "first" cached
    mod.env["arn"] = "deployed"
    runner = LambdaRunner({})
    monkeypatch.setattr(runner, "_verify_handler", lambda asset, module: None)
    monkeypatch.setattr(runner, "asset_dir", lambda fn: None)
    monkeypatch.setattr(lambda_runner.LambdaRunner, "handler_name",
                        classmethod(lambda cls, fn: "lambdas.fake_direct.handler"))
    fn = SimpleNamespace(function_name="f", function_arn="arn:9", environment_vars={}, memory_size=128, timeout=3,
                         logs_group_name="/aws/lambda/f", run_time="python3.11")
    assert '"deployed"' in runner(fn, {})[0]
