"""Prefetch on the moto control plane, the agent in process: a held generate job's input and published model are
fetched into the node cache with the attempt's own credentials (vended by the node API, which checks the attempt
is this node's), the input is advertised in the node's datasets, and the job's staging and model load at start
are cache hits; a message for an attempt placed on another node gets no credentials, and the job is left held
as it was."""

from __future__ import annotations

import logging
import os
import time

import boto3

from gpufleet.clock import SystemClock
from gpufleet.envelope import Envelope
from gpufleet.models.loader import ModelLoader, publish_model
from gpufleet.runtime.staging import Stager
from gpufleet.store.nodeapi import scoped_s3_client
from gpufleet.store.objectstore import ObjectStore
from onprem_agent.agent import Agent
from onprem_agent.aws import Message
from onprem_agent.runner import request_for
from onprem_agent.settings import AgentSettings


def _prefetches(agent: Agent, outcome: str) -> float:
    return agent.metrics.registry.get_sample_value("gpufleet_agent_prefetches_total", {"outcome": outcome}) or 0.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _until(cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_held_jobs_input_is_prefetched_with_its_attempts_credentials_and_hits_at_start(fleet, tmp_path):
    uri = f"s3://{fleet.bucket}/tenants/t/clip.bin"
    fleet.s3.put_object(Bucket=fleet.bucket, Key="tenants/t/clip.bin", Body=b"c" * 4096)
    models = f"s3://{fleet.bucket}/models/"
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "model_index.json").write_text("{}")
    (tmp_path / "m1" / "weights.bin").write_bytes(b"w" * 8192)
    publish_model(tmp_path / "m1", ObjectStore(fleet.s3), models, "m1")
    settings = AgentSettings.model_validate({**fleet.agent("node-p").settings, "metrics_enabled": False})
    kw = {"endpoint_url": fleet.endpoint, "region_name": "us-east-1"}
    api = fleet.node_api("node-p")
    environ = {**os.environ, "GPUFLEET_MODEL_S3_ROOT": models}  # where this node's runtime finds models
    agent = Agent(settings, clock=SystemClock(), environ=environ, sqs=boto3.client("sqs", **kw), node_api=api)
    spec = {
        "workload": {"kind": "video.generate", "prompt": "a lighthouse", "model": "m1"},
        "resources": {"gpus": 1},
        "data": {"inputs": [uri]},
    }
    fleet.submit("job-p1", spec=spec)
    fleet.place("job-p1", "node-p", heartbeat_s=30, stage="generate")
    msgs: list[Message] = []
    _until(lambda: msgs.extend(agent.queue.receive(1, 1, 30)) or msgs)
    env = Envelope.model_validate_json(msgs[0].body)
    agent.slots.acquire("busy@0", request_for(env))  # the node's one slot is taken: the job is held
    lines, logger = _Lines(), logging.getLogger("onprem_agent.prefetch")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        agent.accept(msgs[0])
        agent.dispatch()
        _until(lambda: _prefetches(agent, "done") == 1)
        assert ("job-p1", 1) in agent._held
        assert agent.cache.input_uris(10, 10_000) == [uri] and uri in agent._datasets()

        # the job starts: its staging and model load, with the same attempt's credentials, move nothing
        objects = ObjectStore(scoped_s3_client(api, "job-p1", 1, region="us-east-1", endpoint_url=fleet.endpoint))
        staged = Stager(objects, settings.cache_dir).stage([uri], tmp_path / "inputs")
        assert (staged.bytes_moved, staged.bytes_cached) == (0, 4096)
        model = ModelLoader(settings.cache_dir, objects, None, models).resolve("m1")
        assert model.bytes_downloaded == 0  # the generate stage's phases: model_cache "hit", model_bytes 0

        # another node's attempt: the node API vends no credentials; the prefetch fails, the job stays held
        fleet.submit("job-p2", spec=spec)
        fleet.place("job-p2", "node-q", heartbeat_s=30)
        other = env.model_copy(update={"job_id": "job-p2"})
        agent.accept(Message("m-p2", "r-p2", other.model_dump_json(), time.time(), 1))
        agent.dispatch()
        _until(lambda: _prefetches(agent, "failed") == 1)
        assert ("job-p2", 1) in agent._held
        (failed,) = [r for r in lines.records if r.msg.startswith("prefetch failed")]
        assert failed.job_id == "job-p2" and "NotAllowed" in failed.detail and "node-p" in failed.detail
        (done,) = [r for r in lines.records if r.msg == "prefetched"]
        assert (done.job_id, done.inputs, done.input_bytes_moved) == ("job-p1", 1, 4096)
        assert (done.model, done.model_bytes_moved) == ("m1", 8194)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
        agent.prefetcher.close()
