"""InfraConfig from CDK context: command-line strings are coerced, bad values rejected (pure, no synth)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.config import InfraConfig


def ctx(**values):
    return lambda key: values.get(key.removeprefix("gpufleet:"))


def test_context_strings_are_coerced():
    cfg = InfraConfig.from_context(ctx(heartbeat_seconds="3", gpu_instance_types="g5.xlarge, g6.xlarge",
                                       api_rate_limit="12.5", prefix="dev"))
    assert cfg.heartbeat_seconds == 3 and cfg.api_rate_limit == 12.5
    assert cfg.gpu_instance_types == ("g5.xlarge", "g6.xlarge")
    assert cfg.name("jobs") == "dev-jobs" and cfg.node_queue_prefix == "dev-node-"


def test_defaults_without_context():
    cfg = InfraConfig.from_context(ctx())
    assert cfg == InfraConfig() and cfg.removal == "retain" and cfg.node_queue_prefix == "gpufleet-node-"
    # finalize retries wait 5, 10 s in a deployment (a stack's CDK context may shorten them)
    assert (cfg.finalize_retry_interval_seconds, cfg.finalize_max_attempts, cfg.finalize_retry_backoff_rate) == (5, 3, 2.0)


@pytest.mark.parametrize("bad", [{"removal": "delete"}, {"heartbeat_seconds": "0"}, {"prefix": "Bad_Prefix"},
                                 {"bucket_prefix": "-x"}, {"unknown_key": "1"},
                                 {"finalize_retry_backoff_rate": "0.5"}, {"gpu_host_cache_gib": "-1"},
                                 {"ondemand_min_vcpus": "128", "ondemand_max_vcpus": "64"}])
def test_invalid_context_is_rejected(bad):
    with pytest.raises(ValidationError):
        InfraConfig(**bad)

