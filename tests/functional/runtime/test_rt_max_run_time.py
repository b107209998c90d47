"""The spec's max_run_seconds in the runtime (moto): a generate stage still running at the limit is stopped
through the run control, as a cancel is, and exits TIMED_OUT without persisting an output."""

from __future__ import annotations

import io
import json

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime import denoise
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings

pytestmark = pytest.mark.xdist_group("runtime-torch")


def test_a_generate_stage_past_its_max_run_seconds_exits_timed_out(aws, rt, tmp_path, tiny_cache, monkeypatch):
    real_step, steps = denoise.denoise_step, []

    def slow_step(*args, **kwargs):  # each step takes 50 ms: 200 steps run far past the 3 s limit
        steps.append(1)
        import threading

        threading.Event().wait(0.05)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(denoise, "denoise_step", slow_step)
    # 3 s, not 1: the limit counts from the stage's start, and loading the model on a loaded 2-core machine took
    # over 1 s once (stopped before its first step)
    spec = {**rt.video_spec(steps=200), "max_run_seconds": 3}
    aws.put_job("job_slow", 1, spec)
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tiny_cache), checkpoint_every_steps=0,
                               progress_interval_s=0, log_flush_s=0, tiny_generate_side=32, torch_threads=1)
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(aws.envelope("job_slow", 1, spec))], settings=settings, s3=aws.s3,
                dynamodb=aws.ddb, stdout=out, install_signals=False)
    result = json.loads(out.getvalue().splitlines()[-1])
    assert code == ExitCode.TIMED_OUT and result["exit_code"] == "TIMED_OUT", result
    assert result["detail"] == "maximum run time of 3 s exceeded"
    assert 0 < len(steps) < 200
    assert "generated" not in aws.job("job_slow")
    assert not [k for k in aws.keys("bucket_outputs", "jobs/job_slow/") if "/generated/" in k]
