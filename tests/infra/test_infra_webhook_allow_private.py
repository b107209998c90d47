"""GPUFLEET_WEBHOOK_ALLOW_PRIVATE: absent from a production synth, set on the API and sender in the local one."""

from __future__ import annotations

import pytest

from gpufleet.local.synth import LOCAL_CONTEXT, synthesize, template
from infra.config import CONTEXT_PREFIX, InfraConfig

pytestmark = pytest.mark.xdist_group("cdk-synth")

VAR = "GPUFLEET_WEBHOOK_ALLOW_PRIVATE"


def _env_by_function(tpl: dict) -> dict[str, dict]:
    out = {}
    for r in tpl["Resources"].values():
        env = r.get("Properties", {}).get("Environment", {}).get("Variables", {})
        if r["Type"] == "AWS::Lambda::Function" and "GPUFLEET_FUNCTION" in env:
            out[env["GPUFLEET_FUNCTION"]] = env
    return out


def production_context() -> dict:
    """LOCAL_CONTEXT's keys set back to the production defaults: the config equals the default context's."""
    return {k: InfraConfig.model_fields[k.removeprefix(CONTEXT_PREFIX)].get_default(call_default_factory=True)
            for k in LOCAL_CONTEXT}


def test_production_context_is_the_default_config():
    merged = {**LOCAL_CONTEXT, **production_context()}
    assert InfraConfig.from_context(merged.get) == InfraConfig.from_context(lambda _k: None) == InfraConfig()
    assert InfraConfig().webhook_allow_private is False


def test_production_synth_does_not_allow_private_webhook_targets():
    from gpufleet.finalize_route import LAMBDA_MAX_PIXELS
    from tests.infra.test_infra_security_template import _definition

    tpl = template(synthesize(production_context()))
    envs = _env_by_function(tpl)
    assert {"api", "webhook"} <= envs.keys()
    assert all(VAR not in env for env in envs.values())
    # and FinalizeRoute's bound is the deployment default (LOCAL_CONTEXT's is test-sized)
    (rule,) = _definition(tpl)["States"]["FinalizeRoute"]["Choices"]
    assert rule["And"][1]["NumericLessThanEquals"] == LAMBDA_MAX_PIXELS


def test_local_synth_allows_them_on_the_api_and_the_sender_only(tpl):
    envs = _env_by_function(tpl)
    assert {k for k, env in envs.items() if env.get(VAR) == "true"} == {"api", "webhook"}
