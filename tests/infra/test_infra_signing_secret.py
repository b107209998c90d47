"""The C2PA signing secret: provisioned by the template, named only on the finalize job definition, and
readable only by the finalize job definition's role (identity grant + a resource policy denying every other
principal); the GPU definition (generate, container) runs under another role, which cannot read it."""

from __future__ import annotations

import json

import pytest

from tests.infra.test_infra_template import as_list, policy_statements, resources

pytestmark = pytest.mark.xdist_group("cdk-synth")


def _secret_id(tpl: dict) -> str:
    (lid,) = [k for k in resources(tpl, "AWS::SecretsManager::Secret") if k.startswith("ComputeSigningSecret")]
    return lid


def _job_role(tpl: dict, name: str = "Finalize") -> str:
    (lid,) = [k for k in resources(tpl, "AWS::IAM::Role") if k.startswith(f"Compute{name}JobRole")]
    return lid


def _policy_roles(tpl: dict, rid: str) -> list[str]:
    r = tpl["Resources"][rid]
    if r["Type"] == "AWS::IAM::Role":
        return [rid]
    return [x["Ref"] for x in r["Properties"].get("Roles", []) if isinstance(x, dict) and "Ref" in x] or [rid]


def _job_definitions(tpl: dict) -> dict[str, dict]:
    return {k[len("Compute"):].split("Job")[0]: r["Properties"] for k, r in resources(tpl, "AWS::Batch::JobDefinition").items()
            if k.startswith("Compute")}


def test_the_signing_secret_is_provisioned_and_named_only_on_the_finalize_job_definition(tpl):
    secret = _secret_id(tpl)
    props = tpl["Resources"][secret]["Properties"]
    assert "GenerateSecretString" in props and "SecretString" not in props  # no key material in the template
    defs = _job_definitions(tpl)
    env = {e["Name"]: e["Value"] for e in defs["Cpu"]["ContainerProperties"].get("Environment", [])}
    assert env["GPUFLEET_SIGNING_SECRET_ID"] == {"Ref": secret}
    assert defs["Cpu"]["ContainerProperties"]["JobRoleArn"] == {"Fn::GetAtt": [_job_role(tpl), "Arn"]}
    assert "GPUFLEET_SIGNING_SECRET_ID" not in json.dumps(defs["Gpu"])
    # the GPU definition (generate runs a diffusion model on tenants' prompts) has a role of its own
    assert defs["Gpu"]["ContainerProperties"]["JobRoleArn"] == {"Fn::GetAtt": [_job_role(tpl, "Run"), "Arn"]}
    # no Lambda function is told where the key is
    for fn in resources(tpl, "AWS::Lambda::Function").values():
        assert secret not in json.dumps(fn["Properties"].get("Environment", {}))


def test_only_the_finalize_job_role_may_read_the_signing_secret(tpl):
    secret, role = _secret_id(tpl), _job_role(tpl)
    readers = set()
    for rid, stmt in policy_statements(tpl):
        if stmt.get("Effect", "Allow") != "Allow":
            continue
        actions = as_list(stmt["Action"])
        if not any(a in ("*", "secretsmanager:*", "secretsmanager:GetSecretValue") or a.startswith("secretsmanager:Get")
                   for a in actions):
            continue
        res = as_list(stmt.get("Resource", []))
        assert "*" not in res, f"{rid} may read every secret: {stmt}"
        if secret in json.dumps(res):
            readers.update(_policy_roles(tpl, rid))
            assert actions == ["secretsmanager:GetSecretValue"] or actions == "secretsmanager:GetSecretValue"
    assert readers == {role}
    assert _job_role(tpl, "Run") not in readers  # the generate/container role holds no grant
    # the resource policy denies the read to every principal but the finalize role (the run role included)
    (policy,) = [r["Properties"] for r in resources(tpl, "AWS::SecretsManager::ResourcePolicy").values()
                 if r["Properties"]["SecretId"] == {"Ref": secret}]
    (deny,) = [s for s in policy["ResourcePolicy"]["Statement"] if s["Effect"] == "Deny"]
    assert as_list(deny["Action"]) == ["secretsmanager:GetSecretValue"] and deny["Principal"] == {"AWS": "*"}
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": {"Fn::GetAtt": [role, "Arn"]}}}
