"""A warm worker's batch of generate stages (one thread each, one denoising batch): every member that finishes
has bitwise the frames it gets alone; a member whose job is cancelled and one fenced off by a newer epoch
leave at the next step boundary, exit CANCELLED / FENCED and write no output, and the others go on
undisturbed; each member's GPU-seconds carry its share of the batch."""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime import denoise, resident, worker
from gpufleet.runtime.batchloop import DenoiseBatch
from gpufleet.runtime.control import RunControl
from gpufleet.runtime.generate import unpack_output
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.fencing import issue_epoch
from gpufleet.tables import JOB_META, job_pk

pytestmark = pytest.mark.xdist_group("runtime-torch")

STEPS = 6


def _spec(rt, prompt: str, seed: int) -> dict:
    return rt.video_spec(prompt, width=64, height=64, frames=5, steps=STEPS, seed=seed)


def _frames(aws, job_id: str) -> np.ndarray:
    frames, _meta = unpack_output(aws.get("bucket_outputs", aws.job(job_id)["generated"]["key"]))
    return frames


def test_batch_members_match_their_solo_runs_and_cancelled_or_fenced_members_leave(
    aws, rt, tiny_cache, tmp_path, monkeypatch
):
    monkeypatch.setattr(resident, "RESIDENT", resident.ResidentModels())  # one pipeline shared, as in a worker
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"),
        cache_dir=str(tiny_cache),
        log_flush_s=0,
        torch_threads=1,
        progress_interval_s=0,
        tiny_generate_side=32,
        checkpoint_every_steps=2,
        async_checkpoints=False,
    )
    specs = {
        "a": _spec(rt, "a red fox running in snow", 3),
        "b": _spec(rt, "a blue bird over the sea", 4),
        "c": _spec(rt, "a cat", 5),
        "f": _spec(rt, "a boat on a river", 6),
    }
    for name in ("a", "b"):  # alone first: the reference frames
        aws.put_job(f"solo_{name}", 1, specs[name])
        code = main(
            ["--envelope-json", json.dumps(aws.envelope(f"solo_{name}", 1, specs[name]))],
            settings=settings,
            s3=aws.s3,
            dynamodb=aws.ddb,
            stdout=io.StringIO(),
            install_signals=False,
        )
        assert code == ExitCode.SUCCEEDED
    for name, spec in specs.items():
        aws.put_job(f"bat_{name}", 1, spec)

    real_step, rounds = denoise.denoise_batch_step, []

    def step(pipe, members):
        rounds.append(len(members))
        if len(rounds) == 2:  # a cancel and a newer attempt arrive while the batch runs
            aws.ddb.update_item(
                TableName=aws.tables.jobs,
                Key={"pk": {"S": job_pk("bat_c")}, "sk": {"S": JOB_META}},
                UpdateExpression="SET cancel_requested = :t",
                ExpressionAttributeValues={":t": {"BOOL": True}},
            )
            issue_epoch(aws.ddb, aws.tables.jobs, "bat_f", 1)
        real_step(pipe, members)

    monkeypatch.setattr(denoise, "denoise_batch_step", step)
    batch = DenoiseBatch(4, max_members=4, free_bytes=lambda: None, gather_s=10.0)
    replies: list[dict] = []
    threads = []
    for name, spec in specs.items():
        job = {
            "id": f"bat_{name}@1",
            "log": str(tmp_path / f"bat_{name}.log"),
            "argv": ["--envelope-json", json.dumps(aws.envelope(f"bat_{name}", 1, spec))],
            "env": {},
        }
        threads.append(
            threading.Thread(
                target=worker.run_member,
                args=(job, RunControl(), batch.member(), replies.append),
                kwargs={"settings": settings, "s3": aws.s3, "dynamodb": aws.ddb},
            )
        )
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = {r["id"]: ExitCode(r["exit_code"]) for r in replies}
    assert codes == {
        "bat_a@1": ExitCode.SUCCEEDED,
        "bat_b@1": ExitCode.SUCCEEDED,
        "bat_c@1": ExitCode.CANCELLED,
        "bat_f@1": ExitCode.FENCED,
    }, [(tmp_path / f"bat_{n}.log").read_text()[-2000:] for n in specs]
    # c and f leave once a progress write after step 2 is answered (cancelled / a newer epoch); the writer runs beside
    # the denoising loop, so on a loaded machine a member may take a step more before the answer stops it
    assert rounds[:2] == [4, 4] and len(rounds) == STEPS and rounds[-1] == 2, rounds
    assert all(a >= b for a, b in zip(rounds, rounds[1:], strict=False)), rounds
    assert np.array_equal(_frames(aws, "bat_a"), _frames(aws, "solo_a"))
    assert np.array_equal(_frames(aws, "bat_b"), _frames(aws, "solo_b"))
    for gone in ("bat_c", "bat_f"):
        assert "generated" not in aws.job(gone)
        assert aws.keys("bucket_outputs", f"jobs/{gone}/") == []
    c_steps = batch.ledger.steps(2)  # the rounds member c took part in
    assert 2 <= c_steps < STEPS and 2 <= int(aws.job("bat_c")["progress"]["step"]) <= c_steps
    # each member's share of the rounds follows the rounds it took part in (members a, b, c, f are indices
    # 0..3), and the GPU-seconds billed add up to the batch's time, a member that stayed paying more
    ledger = batch.ledger
    assert sum(ledger.share_s(i) for i in range(4)) == pytest.approx(ledger.total_s)
    assert ledger.share_s(0) > ledger.share_s(2) and ledger.steps(0) == STEPS and ledger.steps(2) == c_steps
    gpu = {r["id"]: r["gpu_seconds"] for r in replies}
    assert sum(gpu.values()) == pytest.approx(batch.presence.total_s, abs=1e-3)
    assert gpu["bat_a@1"] > gpu["bat_c@1"] > 0 and gpu["bat_a@1"] > gpu["bat_f@1"] > 0
    log_a = (tmp_path / "bat_a.log").read_text()
    assert "bat_c" not in log_a and "bat_f" not in log_a  # each member's log holds its own lines only
