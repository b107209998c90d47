"""FinalizeLambda's handler on moto (lambdas/tasks/finalize.py over gpufleet.runtime.warm_finalize): the same runtime
command the CPU Batch job runs, with the pointer envelope, signed with the provisioned secret; the same fenced
result on the job item; a failure is an exception (the workflow's Retry/Catch), a command other than finalize's is
refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import numpy as np
import pytest

from gpufleet.envelope import Envelope
from gpufleet.errors import ValidationFailed
from gpufleet.lifecycle.steps import runtime_command
from gpufleet.provenance import verify
from gpufleet.provenance.keys import SigningCredentials, _generate, credentials_to_secret
from gpufleet.provenance.watermark import payload_hex
from gpufleet.runtime.generate import pack_output
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.warm_finalize import Clients, FinalizeFailed, run
from gpufleet.store.objectstore import sha256_hex

pytestmark = pytest.mark.xdist_group("runtime-torch")


def _job(aws, rt, job_id: str, *, epoch: int = 1, generated: bool = True) -> dict:
    """A job whose generate stage left its output; the finalize event CompleteRun's result gives FinalizeLambda."""
    spec = rt.video_spec()
    extra = {}
    if generated:
        frames = np.full((5, 32, 32, 3), 0.35, dtype=np.float32)
        frames[:, :, :, 2] = 0.8  # blue-ish: never blocked
        data = pack_output(frames, {"model": "wan-tiny", "model_hash": "m", "prompt_sha256": "p", "fps": 8})
        key = f"jobs/{job_id}/generated/e{epoch:04d}.npz"
        aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key=key, Body=data)
        extra["generated"] = {"key": key, "sha256": sha256_hex(data)}
    aws.put_job(job_id, epoch, spec, **extra)
    envelope = Envelope.model_validate(aws.envelope(job_id, epoch, spec, stage="finalize"))
    return {"job_id": job_id, "command": runtime_command(envelope)}  # the pointer envelope: no spec, no prompt


@pytest.fixture
def signing(aws, tmp_path):
    key_pem, chain_pem, anchor_pem = _generate()
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="gpufleet-c2pa-signing",
                           SecretString=credentials_to_secret(SigningCredentials(key_pem, chain_pem)))["ARN"]
    wm_arn = sm.create_secret(Name="gpufleet-watermark", SecretString='{"seed": "%s"}' % ("w" * 64))["ARN"]
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), progress_interval_s=0, log_flush_s=0,
                               signing_secret_id=arn, watermark_secret_id=wm_arn, torch_threads=1)
    return settings, Clients(s3=aws.s3, dynamodb=aws.ddb, secretsmanager=sm), anchor_pem.decode()


def test_the_warm_finalize_delivers_what_the_batch_job_does_and_serves_job_after_job(aws, rt, signing, tmp_path):
    settings, clients, anchor = signing
    for job_id in ("job_w1", "job_w2"):  # one container, two jobs: nothing of the first leaks into the second
        event = _job(aws, rt, job_id)
        assert "spec" not in json.loads(event["command"][-1])
        result = run(event, clients, settings)
        assert result["exit_code"] == "SUCCEEDED" and result["blocked"] is False
        item = aws.job(job_id)
        assert item["output"]["video_key"] == f"jobs/{job_id}/video.mp4"
        assert item["output"]["watermark_payload"] == payload_hex(job_id)
        assert item["moderation"]["blocked"] is False
        video = tmp_path / f"{job_id}.mp4"
        video.write_bytes(aws.get("bucket_outputs", result["video_key"]))
        checked = verify(video, anchor)
        assert checked.c2pa_state == "Trusted" and checked.job_id == job_id
        assert aws.keys("bucket_logs", f"jobs/{job_id}/")  # its log pages, as the Batch job writes them
    # a retry after a lost answer returns the recorded result without redoing work
    again = run(event, clients, settings)
    assert again["video_sha256"] == result["video_sha256"]


def test_a_failed_stage_raises_naming_its_exit_code(aws, rt, signing):
    settings, clients, _ = signing
    with pytest.raises(FinalizeFailed, match="SYSTEM_ERROR") as err:
        run(_job(aws, rt, "job_nogen", generated=False), clients, settings)  # nothing generated to finalize
    assert err.value.extra["exit_code"] == "SYSTEM_ERROR"
    event = _job(aws, rt, "job_moved")
    aws.put_job("job_moved", 2, json.loads(json.dumps(rt.video_spec())))  # a newer attempt owns the job
    with pytest.raises(FinalizeFailed, match="FENCED"):
        run(event, clients, settings)
    assert "output" not in aws.job("job_moved")


@pytest.mark.parametrize("change", ["program", "file", "stage", "job", "extra"])
def test_only_the_finalize_command_of_the_events_job_runs(aws, rt, signing, change, tmp_path):
    settings, clients, _ = signing
    event = _job(aws, rt, "job_ref")
    command = list(event["command"])
    envelope = json.loads(command[-1])
    if change == "program":
        command[0] = "/bin/sh"
    elif change == "file":
        path = tmp_path / "env.json"
        path.write_text(command[-1])
        command[-2:] = ["--envelope-file", str(path)]
    elif change == "stage":
        command[-1] = json.dumps({**envelope, "stage": "generate"})
    elif change == "job":
        event = {**event, "job_id": "job_other"}
    else:
        command.append("--help")
    with pytest.raises(ValidationFailed):
        run({**event, "command": command}, clients, settings)
    assert "output" not in aws.job("job_ref") and aws.keys("bucket_logs", "jobs/job_ref/") == []


def test_the_handler_keeps_its_clients_and_settings_per_container(monkeypatch):
    from lambdas.tasks import finalize

    finalize.clients.cache_clear(), finalize.settings.cache_clear()
    monkeypatch.setenv("GPUFLEET_SIGNING_SECRET_ID", "arn:aws:secretsmanager:us-east-1:123456789012:secret:x")
    assert finalize.clients() is finalize.clients()
    assert finalize.settings().signing_secret_id.endswith(":secret:x")
    assert Path(finalize.__file__).name == "finalize.py"
    finalize.clients.cache_clear(), finalize.settings.cache_clear()
