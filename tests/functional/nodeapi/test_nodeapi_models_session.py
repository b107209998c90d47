"""The node API puts the deployment's published models (``GPUFLEET_MODEL_S3_ROOT``) in every attempt session it vends:
an on-prem node's attempt credentials and a cloud supervisor's session may read them (``s3:GetObject`` only); a node
API without the setting vends what it always did, and a malformed root is refused at start-up."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest

from gpufleet.errors import ConfigError
from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.settings import NodeApiSettings, build_api

ROOT = "s3://nodeapi-models/models/"
READ_MODELS = {"Sid": "ReadPublishedModels", "Effect": "Allow", "Action": ["s3:GetObject"],
               "Resource": ["arn:aws:s3:::nodeapi-models/models/*"]}


@contextmanager
def node_api(world, env: dict[str, str]):
    """``world``'s node API built from its settings and the environment ``env`` (as the Lambda loads it); every
    policy it vends is recorded."""
    settings = NodeApiSettings.load(env=env, **world.settings.model_dump(exclude={"model_s3_root"}))
    api, saved = build_api(settings, dynamodb=world.c["dynamodb"], stepfunctions=world.c["stepfunctions"],
                           sts=world.c["sts"], clock=world.clock), world.api
    policies: list[dict] = []
    for vendor in (api.service.d.credentials, api.service.d.supervisor_credentials):
        real = vendor.vend
        vendor.vend = lambda *, session_name, policy, real=real: policies.append(policy) or real(
            session_name=session_name, policy=policy)
    world.api = api
    try:
        yield policies
    finally:
        world.api = saved


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def _onprem_credentials(world) -> None:
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    status, creds = world.op("node-a", job_id, 1, "credentials")
    assert status == 200, creds


def _supervisor_session(world) -> None:
    job_id = _job_id()
    world.put_cloud_attempt(job_id, 1, {"epoch": 1, "attempt": 1, "target": "cloud", "pool": "cloud-ondemand",
                                        "job_queue": "gpufleet-gpu-ondemand", "gpu_milli": 1000,
                                        "price_per_gpu_hour": 3.0})
    token, digest = supervisor.mint()
    world.runs.record_cloud_dispatch(job_id, 1, digest, 1.0, inputs=())
    status, creds = world.call(None, "POST", "/v1/node/cloud/credentials", {"job_id": job_id, "epoch": 1,
                                                                             "token": token})
    assert status == 200, creds


@pytest.mark.parametrize("session", [_onprem_credentials, _supervisor_session], ids=["onprem", "supervisor"])
def test_a_vended_session_may_read_the_published_models(world, session):
    with node_api(world, {"GPUFLEET_MODEL_S3_ROOT": ROOT}) as policies:
        session(world)
    (policy,) = policies
    assert READ_MODELS in policy["Statement"]
    # nothing else of the models bucket: no write, no listing
    others = [s for s in policy["Statement"] if s != READ_MODELS]
    assert "nodeapi-models" not in str(others)


@pytest.mark.parametrize("session", [_onprem_credentials, _supervisor_session], ids=["onprem", "supervisor"])
def test_without_a_models_root_the_session_names_no_models(world, session):
    with node_api(world, {}) as policies:
        session(world)
    (policy,) = policies
    assert [s for s in policy["Statement"] if s["Sid"] == "ReadPublishedModels"] == []


@pytest.mark.parametrize("root", ["s3://nodeapi-models", "s3://nodeapi-models/models", "nodeapi-models/models/",
                                  "s3://nodeapi-models/*/"])
def test_a_malformed_models_root_is_refused_at_start_up(world, root):
    with pytest.raises(ConfigError, match="model_s3_root"):
        NodeApiSettings.load(env={"GPUFLEET_MODEL_S3_ROOT": root}, **world.settings.model_dump(
            exclude={"model_s3_root"}))
