"""Derived openb variants: each reaches its target share, is seeded, and keeps pods placeable."""

from __future__ import annotations

import pytest

from gpufleet.scheduler.nodetable import Request
from gpufleet.sim.traces import OpenbNode, load_openb_pods
from gpufleet.sim.variants import Variant, derive, describe, write_openb_pods

NODES = [
    OpenbNode("a", 32000, 131072, 8, "A100"),
    OpenbNode("b", 64000, 131072, 4, "T4"),
    OpenbNode("c", 16000, 65536, 2, "T4"),
]
PODS = (
    [Request(4000, 1024, 1, 500)] * 6
    + [Request(8000, 1024, 1, 1000)] * 6
    + [Request(16000, 1024, 4, 1000)] * 1
    + [Request(2000, 1024, 0, 0)] * 2
    + [Request(8000, 1024, 8, 1000)] * 1
)


@pytest.mark.parametrize(
    ("name", "key", "level"),
    [
        ("multigpu60", "multigpu_gpu_share", 0.6),
        ("gpushare50", "gpushare_gpu_share", 0.5),
        ("cpu40", "cpu_only_pod_share", 0.4),
        ("gpuspec50", "constrained_gpu_pod_share", 0.5),
    ],
)
def test_each_variant_reaches_its_level_and_is_seeded(name, key, level):
    v = Variant.parse(name)
    out = derive(PODS, NODES, v, seed=3)
    assert describe(out)[key] >= level and describe(PODS)[key] < level
    assert out == derive(PODS, NODES, v, seed=3)
    if v.kind != "gpuspec":  # added pods come from the trace's own pods of that kind
        assert set(out) == set(PODS) and len(out) > len(PODS)


def test_constrained_pods_get_one_model_that_can_host_them():
    out = derive(PODS, NODES, Variant("gpuspec", 0.99), seed=5)
    for p in out:
        if p.gpu_types:
            (model,) = p.gpu_types
            assert any(n.model == model and n.gpu >= p.num_gpu and n.cpu_milli >= p.cpu_milli for n in NODES)
    assert next(p for p in out if p.num_gpu == 8).gpu_types == frozenset({"A100"})  # only node a has 8 GPUs


def test_cpu_heavy_doubles_cpu_within_the_largest_host():
    out = derive(PODS, NODES, Variant("cpuheavy", 0.99), seed=1)
    assert [p.cpu_milli for p in out if p.num_gpu == 1 and p.gpu_milli == 500][0] == 8000
    assert [p.cpu_milli for p in out if p.num_gpu == 8][0] == 16000  # 2x of 8 cores; node a has 32
    assert [p.cpu_milli for p in out if p.num_gpu == 4][0] == 32000  # node b (64 cores) can host it
    assert all(p.cpu_milli == 2000 for p in out if p.num_gpu == 0)


def test_parse_and_bad_variants(tmp_path):
    assert Variant.parse("cpuheavy50") == Variant("cpuheavy", 0.5) and Variant("cpu", 0.25).name == "cpu25"
    for bad in ("bogus40", "multigpu", "multigpu100"):
        with pytest.raises(ValueError):
            Variant.parse(bad)
    out = derive(PODS, NODES, Variant("gpuspec", 0.5), seed=2)
    path = tmp_path / "v.csv"
    write_openb_pods(out, path)
    assert load_openb_pods(path) == out
