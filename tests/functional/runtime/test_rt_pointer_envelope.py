"""A pointer envelope (what the workflow hands Batch: ids, epoch, buckets; no spec) runs with the spec read
from the job item (gpufleet/runtime/main.py, gpufleet/envelope.py)."""

from __future__ import annotations

import io
import json

from gpufleet.envelope import Envelope, ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings


def _run(aws, tmp_path, envelope: dict) -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=RuntimeSettings(state_dir=str(tmp_path),
                log_flush_s=0, torch_threads=1), s3=aws.s3, dynamodb=aws.ddb, stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_a_pointer_envelope_reads_the_spec_from_the_job_item(aws, rt, tmp_path):
    # the job moved on to epoch 3: the stage, run with the stored spec, is fenced and writes nothing
    aws.put_job("job_ptr", 3, rt.video_spec(steps=2))
    pointer = aws.envelope("job_ptr", 2, {})
    del pointer["spec"]
    code, result = _run(aws, tmp_path, pointer)
    assert code == ExitCode.FENCED and result["exit_code"] == "FENCED"
    assert not {"progress", "checkpoint", "generated"} & set(aws.job("job_ptr"))


def test_a_pointer_envelope_of_a_job_without_a_spec_is_refused_before_any_stage(aws, rt, tmp_path):
    aws.ddb.put_item(TableName=aws.tables.jobs, Item={"pk": {"S": "JOB#job_nospec"}, "sk": {"S": "META"},
                                                      "job_id": {"S": "job_nospec"}, "current_epoch": {"N": "1"}})
    pointer = aws.envelope("job_nospec", 1, {})
    del pointer["spec"]
    code, result = _run(aws, tmp_path, pointer)
    assert code == ExitCode.USER_ERROR and "no spec" in result["detail"]
    assert aws.keys("bucket_logs", "jobs/job_nospec/") == []


def test_pointer_and_with_spec_round_trip(aws, rt):
    spec = rt.video_spec(prompt="a secret prompt")
    spec["data"] = {"inputs": ["s3://tenant-data/in.bin"]}
    full = Envelope.model_validate(aws.envelope("job_rt", 1, spec))
    full = full.with_spec(full.spec)
    assert full.s3.inputs == ["s3://tenant-data/in.bin"]
    pointer = full.pointer()
    text = pointer.model_dump_json(exclude_none=True)
    assert "a secret prompt" not in text and "tenant-data" not in text and '"spec"' not in text
    assert pointer.with_spec(full.spec) == full
