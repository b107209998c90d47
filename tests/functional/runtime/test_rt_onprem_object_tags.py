"""On an on-prem node every object the runtime writes carries ``gpufleet:node=<node id>``.

The agent role may PUT job objects only with that tag (infra/onprem.py, WriteOwnTaggedObjects; moto does not
enforce IAM, so the tags are read back here): checkpoints (thread writer, writer process, the container
stage's checkpoint tar), the generated output, the container's output files and the log chunks. On Batch
(no node id) objects are untagged.
"""

from __future__ import annotations

import io
import json

import boto3

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.objectstore import NODE_TAG_KEY, ObjectStore

NODE = "node-7"
PLACEMENT = {"pool": "onprem", "node": NODE, "gpu_indices": [0]}


def _run(aws, s3, envelope: dict, settings: RuntimeSettings) -> int:
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=s3, dynamodb=aws.ddb,
                stdout=out, install_signals=False)
    assert code == ExitCode.SUCCEEDED, out.getvalue()[-2000:]
    return code


def _tags_by_key(aws, rt, job_id: str) -> dict[str, dict[str, str]]:
    """{"<bucket field>:<key>": {tag: value}} for every object under the job's prefix in the three buckets."""
    got = {}
    for field in ("bucket_checkpoints", "bucket_outputs", "bucket_logs"):
        bucket = rt.BUCKETS[field]
        for key in aws.keys(field, f"jobs/{job_id}/"):
            tagset = aws.s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
            got[f"{field}:{key}"] = {t["Key"]: t["Value"] for t in tagset}
    return got


def _kinds(tags: dict[str, dict]) -> set[str]:
    out = set()
    for name in tags:
        field, key = name.split(":", 1)
        if "/checkpoints/" in key:
            out.add("checkpoint")
        elif "/generated/" in key or "/output/" in key:
            out.add("output")
        elif field == "bucket_logs":
            out.add("log")
    return out


def _settings(tmp_path, cache, **kw) -> RuntimeSettings:
    return RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(cache), checkpoint_every_steps=2,
                           checkpoint_every_seconds=0, checkpoint_overhead_budget=0, log_flush_s=0,
                           log_chunk_lines=3, torch_threads=1, tiny_generate_side=32, **kw)


def test_generate_on_an_onprem_node_tags_checkpoints_output_and_logs(aws, rt, tiny_cache, tmp_path):
    spec = rt.video_spec(steps=6)
    aws.put_job("job_tag", 1, spec)
    _run(aws, aws.s3, aws.envelope("job_tag", 1, spec, placement=PLACEMENT),
         _settings(tmp_path, tiny_cache, node_id=NODE))
    tags = _tags_by_key(aws, rt, "job_tag")
    assert _kinds(tags) == {"checkpoint", "output", "log"}, sorted(tags)
    assert {k: v for k, v in tags.items() if v != {NODE_TAG_KEY: NODE}} == {}


def test_generate_on_batch_leaves_objects_untagged(aws, rt, tiny_cache, tmp_path):
    spec = rt.video_spec(steps=4)
    aws.put_job("job_batch", 1, spec)
    _run(aws, aws.s3, aws.envelope("job_batch", 1, spec, placement={"pool": "cloud"}), _settings(tmp_path, tiny_cache))
    tags = _tags_by_key(aws, rt, "job_batch")
    assert _kinds(tags) == {"checkpoint", "output", "log"}
    assert all(v == {} for v in tags.values())


def test_the_checkpoint_writer_process_tags_with_the_node_id_from_the_environment(moto_server, rt, tiny_cache,
                                                                                   tmp_path, monkeypatch):
    # The writer process builds its clients and store from the environment the agent gave the runtime.
    endpoint, aws = moto_server
    for k, v in {**rt.AWS_ENV, "AWS_ENDPOINT_URL": endpoint, "GPUFLEET_NODE_ID": NODE}.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    spec = rt.video_spec(steps=6)
    job_id = f"job_proc_{tmp_path.name[-12:]}"
    aws.put_job(job_id, 1, spec)
    _run(aws, s3, aws.envelope(job_id, 1, spec, placement=PLACEMENT),
         _settings(tmp_path, tiny_cache, node_id=NODE, checkpoint_writer="process"))
    tags = _tags_by_key(aws, rt, job_id)
    assert "checkpoint" in _kinds(tags)
    assert {k: v for k, v in tags.items() if v != {NODE_TAG_KEY: NODE}} == {}


def test_container_stage_tags_its_checkpoint_tar_and_output_files(aws, rt, tmp_path, oci):
    script = ("import os; d=os.environ['GPUFLEET_CHECKPOINT_DIR']; open(os.path.join(d,'state'),'w').write('1');"
              "open(os.path.join(os.environ['GPUFLEET_OUTPUT_DIR'],'r.txt'),'w').write('ok'); print('done')")
    spec = {"workload": {"kind": "container", "image": oci.image, "command": ["python3", "-c", script],
                         "checkpoint_interval_s": 10}, "resources": {"gpus": 1}}
    aws.put_job("job_ctag", 1, spec)
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), log_flush_s=0,
                               container_grace_s=5, node_id=NODE, **oci.settings)
    _run(aws, aws.s3, aws.envelope("job_ctag", 1, spec, stage="container", placement=PLACEMENT), settings)
    tags = _tags_by_key(aws, rt, "job_ctag")
    assert _kinds(tags) == {"checkpoint", "output", "log"}, sorted(tags)
    assert {k: v for k, v in tags.items() if v != {NODE_TAG_KEY: NODE}} == {}


def test_object_store_node_id_comes_from_the_runtime_settings_and_explicit_beats_the_environment():
    settings = RuntimeSettings.load(env={"GPUFLEET_NODE_ID": "node/from env"})
    assert ObjectStore(client=object(), node_id=settings.node_id).tagging == "gpufleet%3Anode=node%2Ffrom%20env"
    assert RuntimeSettings.load(env={"GPUFLEET_NODE_ID": "node/from env"}, node_id="n1").node_id == "n1"
    assert ObjectStore(client=object(), node_id="").tagging is None
    assert ObjectStore(client=object(), node_id="n1").tagging == "gpufleet%3Anode=n1"
