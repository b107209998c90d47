"""The framework's wiring: the explicit registry, the validated configuration (the allowlist scope
always on, deployment settings), and a Framework that runs exactly the plugins it was built with."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError
from sched_strategies import snapshot

from gpufleet.errors import ConfigError
from gpufleet.scheduler import registry
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import CONFIG_ENV, Framework, SchedulerConfig, load_config, parse_config
from gpufleet.scheduler.model import NodeState, PendingJob
from gpufleet.scheduler.ordering import Fifo
from gpufleet.scheduler.packing import BestFit
from gpufleet.scheduler.pool_policy import AllowlistScope, GpuTypeFilter, QuotaFilter
from gpufleet.scheduler.results import Outcome, Status


def job(jid, **kw):
    base = dict(tenant="t", team="a", user="u", created_at=0.0, pending_since=0.0, cpu_milli=1000, memory_mib=1024)
    base.update(kw)
    return PendingJob(jid, **base)


def node(nid, free=(1000,) * 4):
    return NodeState(nid, "onprem-a", "A100", tuple(free), 64000, 512_000)


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize("kind", registry.KINDS)
def test_registry_rejects_unknown_names_with_config_error(kind):
    with pytest.raises(ConfigError, match="no-such-plugin"):
        registry.build(kind, "no-such-plugin")
    with pytest.raises(ConfigError, match="extension point"):
        registry.build("no-such-kind", registry.names(kind)[0])


def test_registry_builds_every_built_in_and_packing_is_one_of_its_kinds():
    for kind in registry.KINDS:
        assert registry.names(kind)
        for name in registry.names(kind):
            assert registry.build(kind, name) is not None
    assert registry.names("packing") == ("random", "dot-product", "packing", "best-fit", "fgd", "frag-aware")
    assert all(registry.build("packing", n).name == n for n in registry.names("packing"))
    assert registry.build("packing", "frag-aware", tolerance=5.0).tolerance == 5.0


def test_config_checks_every_name_against_the_registry():
    for bad in (dict(filters=("quota", "nope")), dict(static_filters=("nope",)), dict(scopes=("nope",)),
                dict(reserve="nope"), dict(preempt="nope"), dict(default_policy="nope"), dict(packing="nope")):
        with pytest.raises(ValidationError, match="nope"):
            SchedulerConfig(**bad)
    with pytest.raises(ValidationError):
        SchedulerConfig(bogus_field=1)


# ---------------------------------------------------------------- allowlist always on


@pytest.mark.parametrize("cfg", [
    SchedulerConfig(filters=()),
    SchedulerConfig(scopes=(), filters=("quota",), static_filters=()),
    parse_config('{"scopes": [], "filters": []}'),
])
def test_a_config_without_the_allowlist_still_applies_it(cfg):
    assert "allowlist" in cfg.scopes
    assert any(isinstance(s, AllowlistScope) for s in Framework.from_config(cfg).scopes)
    # on-prem is cheaper, but the job only allows the cloud pool
    r = run_cycle(snapshot((node("n0"),), (job("j", pools=("cloud-spot",)),), {}), cfg)
    assert [p.pool.name for p in r.placements] == ["cloud-spot"]
    r = run_cycle(snapshot((node("n0"),), (job("k", pools=("zz",)),), {}), cfg)
    assert not r.placements and r.status["k"].outcome is Outcome.UNRESOLVABLE and "zz" in r.status["k"].reason


def test_allowlist_stays_in_a_config_that_names_it_with_other_scopes():
    assert SchedulerConfig(scopes=("allowlist",)).scopes == ("allowlist",)
    assert SchedulerConfig().scopes == ("allowlist",)


# ---------------------------------------------------------------- deployment configuration


def test_load_config_reads_the_deployment_setting_and_defaults_when_unset():
    assert load_config({}) == SchedulerConfig()
    assert load_config({CONFIG_ENV: ""}) == SchedulerConfig()
    cfg = load_config({CONFIG_ENV: '{"queue_sort": "fifo", "preempt": null, "filters": ["gpu-type"], "starvation_s": 60}'})
    assert cfg.queue_sort == "fifo" and cfg.preempt is None and cfg.filters == ("gpu-type",) and cfg.starvation_s == 60


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '{"queue_sort": "lottery"}', '{"starvation_s": -1}', '{"x": 1}'])
def test_an_invalid_deployment_setting_is_a_config_error(raw):
    with pytest.raises(ConfigError, match=CONFIG_ENV):
        load_config({CONFIG_ENV: raw})


# ---------------------------------------------------------------- the Framework runs its plugins


def test_a_custom_configs_plugins_are_the_ones_the_framework_builds():
    cfg = SchedulerConfig(queue_sort="fifo", filters=("gpu-type", "quota"), static_filters=("gpu-type",),
                          preempt=None, packing="best-fit")
    fw = Framework.from_config(cfg)
    assert isinstance(fw.queue_sort, Fifo) and fw.preempt is None and isinstance(fw.packer, BestFit)
    assert [type(f) for f in fw.filters] == [GpuTypeFilter, QuotaFilter]
    assert [type(f) for f in fw.static_filters] == [GpuTypeFilter]
    with pytest.raises(ConfigError):
        fw.score("cheapest")


class _Recording:
    """Wraps a plugin and records each call as (label, method)."""

    def __init__(self, label, inner, calls):
        self.label, self.inner, self.calls = label, inner, calls

    def __getattr__(self, method):
        def call(*args, **kwargs):
            self.calls.append((self.label, method))
            return getattr(self.inner, method)(*args, **kwargs)

        return call


class _NoCloud:
    def filter(self, job, pool, ctx):
        return Status(Outcome.UNSCHEDULABLE, "no cloud here") if pool.kind.is_cloud else Status(Outcome.FITS)


def test_the_cycle_runs_exactly_the_frameworks_plugins():
    cfg = SchedulerConfig(queue_sort="fifo", filters=("gpu-type", "fits-ever", "quota"), preempt=None, packing="best-fit")
    fw = Framework.from_config(cfg)
    calls: list[tuple[str, str]] = []
    spied = dataclasses.replace(
        fw,
        queue_sort=_Recording("fifo", fw.queue_sort, calls),
        filters=tuple(_Recording(n, f, calls) for n, f in zip(cfg.filters, fw.filters, strict=True)),
        reserve=_Recording("gang", fw.reserve, calls),
        packer=_Recording("best-fit", fw.packer, calls),
    )
    r = run_cycle(snapshot((node("n0"),), (job("j", num_gpu=1),), {}), spied)
    assert [p.pool.name for p in r.placements] == ["onprem-a"]
    assert {label for label, _ in calls} == {"fifo", "gpu-type", "fits-ever", "quota", "gang", "best-fit"}
    assert ("best-fit", "choose") in calls and ("fifo", "sort") in calls
    # a plugin handed to the Framework (not in the registry) is run: the full node leaves only cloud pools
    full = node("n0", free=(0, 0, 0, 0))
    r = run_cycle(snapshot((full,), (job("k", num_gpu=1),), {}), dataclasses.replace(fw, filters=(*fw.filters, _NoCloud())))
    assert not r.placements and r.status["k"].outcome is Outcome.UNSCHEDULABLE
    r = run_cycle(snapshot((full,), (job("k", num_gpu=1),), {}), fw)
    assert [p.pool.name for p in r.placements] == ["cloud-spot"]


def test_static_filters_are_configured():
    # an H100 job fits no pool ever (UNRESOLVABLE, backoff) — unless gpu-type is not a static filter,
    # then the pools count as usable if capacity allowed and the job only waits
    j = job("h", num_gpu=1, gpu_type="H100")
    r = run_cycle(snapshot((node("n0"),), (j,), {}))
    assert r.status["h"].outcome is Outcome.UNRESOLVABLE
    r = run_cycle(snapshot((node("n0"),), (j,), {}), SchedulerConfig(static_filters=("residency",), preempt=None))
    assert r.status["h"].outcome is Outcome.UNSCHEDULABLE
