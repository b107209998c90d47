"""Pure rendering and argument handling of the CLI (no sockets)."""

from __future__ import annotations

import argparse
import io

import pytest

from gpufleet.cli.common import ProgressPrinter, progress_bar, table
from gpufleet.cli.events import event_detail
from gpufleet.cli.main import build_parser
from gpufleet.cli.quota import describe
from gpufleet.cli.status import describe as describe_job
from gpufleet.cli.submit import spec_from_args
from gpufleet.errors import ValidationFailed
from gpufleet.sdk_models import Event, Job


def job(**kw) -> Job:
    return Job.model_validate({"job_id": "job_1", "status": "RUNNING", **kw})


def test_progress_bar_tracks_the_denoising_step():
    assert progress_bar(job(progress={"step": 5, "total": 10}), width=10) == "job_1  RUNNING     [#####-----] step 5/10"
    assert progress_bar(job(status="PENDING"), width=4) == "job_1  PENDING     [----]"
    assert progress_bar(job(status="FINALIZING", progress={"step": 3, "total": 10}), width=4).endswith(
        "[####] step 3/10"
    )


def test_progress_printer_prints_only_changes():
    out = io.StringIO()
    printer = ProgressPrinter(out)
    for j in (job(status="PENDING"), job(status="PENDING"), job(progress={"step": 1, "total": 2})):
        printer(j)
    assert len(out.getvalue().splitlines()) == 2


def test_table_aligns_columns():
    assert table([("a", 1), ("bbb", None)], ["X", "LONGER"]).splitlines() == ["X    LONGER", "a    1", "bbb"]


def test_event_and_job_descriptions():
    assert event_detail(Event(ts="t", type="status", detail={"from": ["QUEUED"], "to": "PENDING", "x": None})) == (
        'from=["QUEUED"] to=PENDING'
    )
    rows = dict(
        describe_job(
            job(
                placement={"target": "onprem", "pool": "p", "node": "n", "epoch": 2},
                billing={"charged": False, "gpu_seconds": 0, "amount_usd": 0, "waiver": "system"},
            )
        )
    )
    assert rows["placement"] == "onprem p n (epoch 2)" and rows["billing"].endswith("waiver=system")
    waiting = dict(describe_job(Job.model_validate({"job_id": "j", "status": "PENDING", "scheduling": {
        "reason": "none of the job's pools (gpu-x) exists", "retry_at": "2026-11-30T10:00:00.000Z"}})))
    assert waiting["waiting"] == "none of the job's pools (gpu-x) exists (next try 2026-11-30T10:00:00.000Z)"
    ran = dict(describe_job(job(status="FINALIZING", last_run={"epoch": 1, "gpu_seconds": 9.0, "phases": {
        "durations": {"start": 2.0, "model_load": 3.25, "steps": 7.0}, "model_cache": "miss",
        "model_bytes": 1_500_000_000, "steps": 8, "mean_step_s": 1.0}})))
    assert ran["phases"] == ("start 2.0s, model_load 3.2s (miss, 1.5 GB), steps 7.0s (8 steps, 1.00s each), "
                             "GPU busy not measured")
    busy = dict(describe_job(job(status="FINALIZING", last_run={"epoch": 1, "phases": {
        "durations": {"steps": 7.0, "checkpoint_stall": 0.5}, "gpu_busy": 0.834, "gpu_busy_samples": 14}})))
    assert busy["phases"] == "steps 7.0s, checkpoint_stall 0.5s, GPU busy 83% (14 samples)"
    assert "phases" not in dict(describe_job(job()))


def test_quota_levels_render_as_a_table():
    text = describe(
        {
            "levels": [{"level": "user", "path": "t/a/u", "limits": {"*": 4000}, "usage": {"*": 1000.0}}],
            "queued": {"user": 1, "user_limit": 100, "team": 2, "team_limit": 1000},
        }
    )
    lines = text.splitlines()
    assert lines[0].split() == ["LEVEL", "PATH", "LIMITS", "USAGE"]
    assert lines[1].split() == ["user", "t/a/u", "*=4000", "*=1000"]
    assert lines[2] == "queued jobs: user 1/100, team 2/1000"


def _submit_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["submit", *argv])


def test_submit_builds_a_spec_from_options():
    spec = spec_from_args(
        _submit_args(
            "a fox",
            "--frames",
            "5",
            "--gpus",
            "0.5",
            "--policy",
            "latency",
            "--label",
            "team=vision",
            "--priority",
            "7",
            "--pool",
            "cloud-spot",
            "--pool",
            "onprem-a",
            "--pool",
            "cloud-spot",
        )
    )
    assert spec == {
        "workload": {"kind": "video.generate", "prompt": "a fox", "frames": 5},
        "resources": {"gpus": 0.5},
        "priority": 7,
        "placement_policy": "latency",
        "pools": ["cloud-spot", "onprem-a"],
        "labels": {"team": "vision"},
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "nothing to submit"),
        (("x", "-f", "job.json"), "either a prompt or -f"),
        (("x", "--label", "novalue"), "KEY=VALUE"),
    ],
)
def test_submit_argument_errors(argv, message):
    with pytest.raises(ValidationFailed, match=message):
        spec_from_args(_submit_args(*argv))


def test_every_read_command_takes_json():
    parser = build_parser()
    for argv in (
        ["status", "j"],
        ["ls"],
        ["events", "j"],
        ["logs", "j"],
        ["quota"],
        ["pools"],
        ["output", "j"],
        ["cancel", "j"],
        ["submit", "x"],
    ):
        assert parser.parse_args([*argv, "--json"]).json is True
