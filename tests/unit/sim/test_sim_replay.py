"""The replay simulator (gpufleet.sim.replay) and ``gpufleet simulate replay --diagnose``: injected staging and cold
model loads come back out of the attribution as the top causes, at what was injected."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli.main import main
from gpufleet.diagnose.attribution import Cause, attribute
from gpufleet.errors import ValidationFailed
from gpufleet.sim.replay import ReplayConfig, TraceJob, load_trace, replay

STAGING_S, LOAD_S = 3.0, 8.0
#: 16 one-GPU jobs, each of its own model (every load is cold), arriving faster than 4 GPUs serve them
TRACE = [TraceJob(i * 1.5, 1, f"m{i}", STAGING_S, LOAD_S, 4.0, 0.5) for i in range(16)]
CFG = ReplayConfig(nodes=2, gpus_per_node=2, pass_interval_s=1.0, dispatch_s=0.2, start_s=0.3)


def test_injected_staging_and_cold_loads_rank_first_within_20_percent():
    res = replay(TRACE, CFG)
    assert res.injected == {"staging": 16 * STAGING_S, "model_load": 16 * LOAD_S}
    attr = attribute(res.inputs)
    top = attr.table()[:2]
    assert [r.cause for r in top] == [Cause.MODEL_LOAD, Cause.STAGING]
    for row, injected in zip(top, (res.injected["model_load"], res.injected["staging"]), strict=True):
        assert abs(row.gpu_seconds - injected) <= 0.2 * injected
    # the queue was full while the GPUs were busy elsewhere: computing is well under the whole
    assert attr.utilisation < 0.4


def test_a_warm_cache_takes_model_load_out():
    attr = attribute(replay(TRACE, ReplayConfig(**{**CFG.__dict__, "cache": "warm"})).inputs)
    assert attr.totals_ms[Cause.MODEL_LOAD] == 0
    assert attr.table()[0].cause is Cause.STAGING


def test_a_node_reuses_a_model_it_loaded():
    same = [TraceJob(i * 30.0, 1, "m", 0.0, LOAD_S, 1.0, 0.0) for i in range(3)]
    res = replay(same, ReplayConfig(nodes=1, gpus_per_node=1, pass_interval_s=1.0))
    assert res.injected["model_load"] == LOAD_S  # the first load only


def test_the_command_replays_a_csv_trace_and_writes_the_report(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,gpus,model,staging_s,load_s,compute_s,finalize_s\n"
                     + "".join(f"{j.submit_s},{j.gpus},{j.model},{j.staging_s},{j.load_s},{j.compute_s},{j.finalize_s}\n"
                               for j in TRACE))
    assert len(load_trace(trace)) == 16
    html = tmp_path / "r.html"
    assert main(["simulate", "replay", "--trace", str(trace), "--nodes", "2", "--gpus-per-node", "2",
                 "--pass-interval", "1", "--diagnose", "--json", "--html", str(html)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["causes"][0]["cause"] == "model_load" and out["gpus"] == 4
    assert "<svg" in html.read_text() and "http" not in html.read_text().replace("http://www.w3.org/2000/svg", "")


def test_a_bad_trace_is_refused(tmp_path):
    bad = tmp_path / "b.csv"
    bad.write_text("submit_s,gpus,model,staging_s,load_s,compute_s,finalize_s\n1,x,m,0,0,1,0\n")
    with pytest.raises(ValidationFailed, match="b.csv:2"):
        load_trace(bad)
    with pytest.raises(ValidationFailed, match="more GPUs"):
        replay([TraceJob(0, 8, "m", 0, 0, 1, 0)], ReplayConfig(gpus_per_node=4))
