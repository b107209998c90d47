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


def test_a_batch_multi_node_job_node_records_its_member_state(aws, tmp_path):
    """A cloud gang's node (Batch's multi-node variables set) runs the pointer envelope with its gang role and
    records its member state on the attempt item, fenced on the epoch: running, then the outcome."""
    from gpufleet.store.dynamo import unmarshal
    from gpufleet.tables import attempt_sk, job_pk

    spec = {"workload": {"kind": "container", "image": "registry.example.com/not/allowed:1", "command": ["true"]},
            "resources": {"gpus": 1, "nodes": 2}}
    aws.put_job("job_cg", 1, spec)
    aws.ddb.put_item(TableName=aws.tables.jobs, Item={"pk": {"S": job_pk("job_cg")}, "sk": {"S": attempt_sk(1)}})
    pointer = aws.envelope("job_cg", 1, {}, stage="container")
    del pointer["spec"]
    environ = {"AWS_BATCH_JOB_ID": "b-9#1", "AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1",
               "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.5"}
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(pointer)], settings=RuntimeSettings(
        state_dir=str(tmp_path), log_flush_s=0, torch_threads=1, image_allowlist=["localhost/"]),
        s3=aws.s3, dynamodb=aws.ddb, stdout=out, install_signals=False, environ=environ)
    assert code == ExitCode.USER_ERROR  # the image is not allowed: refused before anything runs
    item = unmarshal(aws.ddb.get_item(TableName=aws.tables.jobs, ConsistentRead=True,
                                      Key={"pk": {"S": job_pk("job_cg")}, "sk": {"S": attempt_sk(1)}})["Item"])
    assert item["batch_node_1"] == {"job": "b-9#1", "state": "user_error"}
    assert "batch_node_0" not in item
    main_node = {**environ, "AWS_BATCH_JOB_ID": "b-9#0", "AWS_BATCH_JOB_NODE_INDEX": "0"}
    del main_node["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]  # Batch sets it on child nodes only
    code = main(["--envelope-json", json.dumps(pointer)], settings=RuntimeSettings(
        state_dir=str(tmp_path), log_flush_s=0, torch_threads=1, image_allowlist=["localhost/"]),
        s3=aws.s3, dynamodb=aws.ddb, stdout=io.StringIO(), install_signals=False, environ=main_node)
    item = unmarshal(aws.ddb.get_item(TableName=aws.tables.jobs, ConsistentRead=True,
                                      Key={"pk": {"S": job_pk("job_cg")}, "sk": {"S": attempt_sk(1)}})["Item"])
    assert code == ExitCode.USER_ERROR and item["batch_node_0"] == {"job": "b-9#0", "state": "user_error"}
