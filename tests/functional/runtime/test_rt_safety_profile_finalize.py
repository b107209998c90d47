"""Finalize on moto with a tenant's frozen safety settings: a strict profile blocks what the default passes.

The tiny Wan model's frames hold a few percent of skin-tone pixels: under the standard backend's
defaults (``exposed_skin`` is scored, not enforced) the video passes; a children's tenant profile
(``exposed_skin`` 0.03) frozen on the job blocks the same frames.
"""

from __future__ import annotations

import io
import json

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.safety.profile import FrozenSafety

pytestmark = pytest.mark.xdist_group("runtime-torch")

STRICT = FrozenSafety(source="tenant", profile_version=3, frame_thresholds={"exposed_skin": 0.03},
                      resolved_at="2026-01-01T00:00:00.000Z").as_item()


@pytest.fixture
def settings(tmp_path, tiny_cache):
    return RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tiny_cache), progress_interval_s=0,
                           log_flush_s=0, tiny_generate_side=32, torch_threads=1, dev_mode=True)


def _run(aws, envelope, settings):
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def _copy_generated(aws, rt, ref: dict, job_id: str) -> dict:
    key = f"jobs/{job_id}/generated/e0001.npz"
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key=key, Body=aws.get("bucket_outputs", ref["key"]))
    return {"key": key, "sha256": ref["sha256"]}


def test_strict_tenant_profile_blocks_a_tiny_model_video_the_default_passes(aws, settings, rt):
    spec = rt.video_spec(steps=4)
    aws.put_job("job_sp_gen", 1, spec)
    code, gen = _run(aws, aws.envelope("job_sp_gen", 1, spec), settings)
    assert code == ExitCode.SUCCEEDED, gen
    ref = aws.job("job_sp_gen")["generated"]

    # The same frames under the deployment default (a job frozen without a profile) and under a strict profile.
    aws.put_job("job_sp_default", 1, spec, generated=_copy_generated(aws, rt, ref, "job_sp_default"),
                safety={"source": "default", "profile_version": 0, "frame_thresholds": {}})
    aws.put_job("job_sp_strict", 1, spec, generated=_copy_generated(aws, rt, ref, "job_sp_strict"), safety=STRICT)
    code, passed = _run(aws, aws.envelope("job_sp_default", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SUCCEEDED and passed["blocked"] is False, passed
    code, blocked = _run(aws, aws.envelope("job_sp_strict", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SUCCEEDED and blocked["blocked"] is True, blocked

    skin = passed["moderation"]["scores"]["exposed_skin"]
    assert 0.03 <= skin < 0.6 and blocked["moderation"]["scores"]["exposed_skin"] == skin
    assert passed["moderation"]["thresholds"] == {"nudity": 0.5, "graphic_violence": 0.07, "minors_risk": 0.2}
    assert passed["moderation"]["backend"] == "standard" and passed["moderation"]["scores"]["nudity"] < 0.5
    assert passed["moderation"]["profile_version"] == 0

    item = aws.job("job_sp_strict")
    assert item["moderation"]["blocked"] is True and item["moderation"]["reason"] == "standard: exposed_skin"
    assert item["moderation"]["thresholds"] == {"nudity": 0.5, "graphic_violence": 0.07, "minors_risk": 0.2,
                                                "exposed_skin": 0.03}
    assert item["moderation"]["profile_version"] == 3
    assert "output" not in item
    assert "jobs/job_sp_strict/video.mp4" not in aws.keys("bucket_outputs", "jobs/job_sp_strict/")
    assert aws.job("job_sp_default")["output"]["video_key"] == "jobs/job_sp_default/video.mp4"


def test_a_job_without_frozen_settings_is_moderated_with_the_deployment_backend(aws, settings, rt):
    """Jobs checked before profiles existed carry no ``safety``: finalize uses ``moderation_backend``."""
    import numpy as np

    from gpufleet.runtime.generate import pack_output
    from gpufleet.store.objectstore import sha256_hex

    frames = np.full((3, 32, 32, 3), 0.35, dtype=np.float32)
    frames[..., 2] = 0.8
    data = pack_output(frames, {"model": "wan-tiny", "fps": 8})
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key="jobs/job_sp_old/generated/e0001.npz", Body=data)
    spec = rt.video_spec()
    aws.put_job("job_sp_old", 1, spec, generated={"key": "jobs/job_sp_old/generated/e0001.npz",
                                                  "sha256": sha256_hex(data)})
    code, result = _run(aws, aws.envelope("job_sp_old", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SUCCEEDED and result["blocked"] is False
    assert result["moderation"]["backend"] == "standard" and result["moderation"]["profile_version"] == 0


def test_frozen_thresholds_the_backend_cannot_apply_fail_the_stage(aws, settings, rt):
    """Fail closed: a strict profile whose category the deployment's backend does not score is a system
    error (finalize retries, then the job fails), never a silent pass."""
    import numpy as np

    from gpufleet.runtime.generate import pack_output
    from gpufleet.store.objectstore import sha256_hex

    data = pack_output(np.zeros((3, 32, 32, 3), dtype=np.float32), {"model": "wan-tiny", "fps": 8})
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key="jobs/job_sp_cfg/generated/e0001.npz", Body=data)
    spec = rt.video_spec()
    aws.put_job("job_sp_cfg", 1, spec, safety={**STRICT, "frame_thresholds": {"nudity": 0.1}, "backend": "skin"},
                generated={"key": "jobs/job_sp_cfg/generated/e0001.npz", "sha256": sha256_hex(data)})
    code, _ = _run(aws, aws.envelope("job_sp_cfg", 1, spec, stage="finalize"), settings)
    assert code != ExitCode.SUCCEEDED
    assert not {"moderation", "output"} & set(aws.job("job_sp_cfg"))
