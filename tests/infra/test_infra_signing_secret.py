"""The C2PA signing secret: provisioned by the template, named only where the finalize stage runs (the finalize job
definition and the FinalizeLambda function), and readable only by those two roles (identity grants + a resource
policy denying every other principal); the GPU definition (generate, container) runs under another role, and every
other function under its own, which cannot read it."""

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


def _finalize_function(tpl: dict) -> tuple[str, dict]:
    """FinalizeLambda's logical id and properties."""
    (found,) = [(k, r["Properties"]) for k, r in resources(tpl, "AWS::Lambda::Function").items()
                if r["Properties"].get("Environment", {}).get("Variables", {}).get("GPUFLEET_FUNCTION") == "finalize"]
    return found


def _finalize_function_role(tpl: dict) -> str:
    return _finalize_function(tpl)[1]["Role"]["Fn::GetAtt"][0]


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
    # no Lambda function but FinalizeLambda is told where the key is
    finalize_id, finalize = _finalize_function(tpl)
    assert finalize["Environment"]["Variables"]["GPUFLEET_SIGNING_SECRET_ID"] == {"Ref": secret}
    for lid, fn in resources(tpl, "AWS::Lambda::Function").items():
        if lid != finalize_id:
            assert secret not in json.dumps(fn["Properties"].get("Environment", {})), lid


def test_only_the_finalize_stages_roles_may_read_the_signing_secret(tpl):
    secret, role, fn_role = _secret_id(tpl), _job_role(tpl), _finalize_function_role(tpl)
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
    assert readers == {role, fn_role}
    assert _job_role(tpl, "Run") not in readers  # the generate/container role holds no grant
    # the resource policy denies the read to every principal but the finalize roles (the run role included)
    (policy,) = [r["Properties"] for r in resources(tpl, "AWS::SecretsManager::ResourcePolicy").values()
                 if r["Properties"]["SecretId"] == {"Ref": secret}]
    (deny,) = [s for s in policy["ResourcePolicy"]["Statement"] if s["Effect"] == "Deny"]
    assert as_list(deny["Action"]) == ["secretsmanager:GetSecretValue"] and deny["Principal"] == {"AWS": "*"}
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": [{"Fn::GetAtt": [role, "Arn"]},
                                                                       {"Fn::GetAtt": [fn_role, "Arn"]}]}}


def _watermark_secret(tpl: dict) -> str:
    (lid,) = [k for k in resources(tpl, "AWS::SecretsManager::Secret") if k.startswith("ComputeWatermarkSecret")]
    return lid


def test_the_watermark_keys_are_generated_at_deploy_and_named_where_they_are_used(tpl):
    """One deployment, one watermark key: a seed generated by the template (no key in it), named on both finalize
    paths (they embed) and the provenance lookup's function (it detects), nowhere else: not the API's."""
    secret = _watermark_secret(tpl)
    gen = tpl["Resources"][secret]["Properties"]["GenerateSecretString"]
    assert gen["GenerateStringKey"] == "seed" and gen["PasswordLength"] >= 32 and "SecretString" not in gen
    defs = _job_definitions(tpl)
    env = {e["Name"]: e["Value"] for e in defs["Cpu"]["ContainerProperties"].get("Environment", [])}
    assert env["GPUFLEET_WATERMARK_SECRET_ID"] == {"Ref": secret}
    assert secret not in json.dumps(defs["Gpu"])  # generate and tenant containers never learn it
    named = {fn["Properties"]["Environment"]["Variables"]["GPUFLEET_FUNCTION"]
             for fn in resources(tpl, "AWS::Lambda::Function").values()
             if secret in json.dumps(fn["Properties"].get("Environment", {}))}
    assert named == {"finalize", "provenance_lookup"}


def test_only_finalize_and_the_provenance_lookup_may_read_the_watermark_keys(tpl):
    secret, role, fn_role = _watermark_secret(tpl), _job_role(tpl), _finalize_function_role(tpl)
    (lookup_role,) = [f["Properties"]["Role"]["Fn::GetAtt"][0]
                      for f in resources(tpl, "AWS::Lambda::Function").values()
                      if f["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == "provenance_lookup"]
    readers = set()
    for rid, stmt in policy_statements(tpl):
        if stmt.get("Effect", "Allow") == "Allow" and secret in json.dumps(as_list(stmt.get("Resource", []))):
            assert as_list(stmt["Action"]) == ["secretsmanager:GetSecretValue"], stmt
            readers.update(_policy_roles(tpl, rid))
    assert readers == {role, fn_role, lookup_role}  # the API's role is not among them
    (policy,) = [r["Properties"] for r in resources(tpl, "AWS::SecretsManager::ResourcePolicy").values()
                 if r["Properties"]["SecretId"] == {"Ref": secret}]
    (deny,) = [s for s in policy["ResourcePolicy"]["Statement"] if s["Effect"] == "Deny"]
    assert deny["Principal"] == {"AWS": "*"} and sorted(
        x["Fn::GetAtt"][0] for x in deny["Condition"]["ArnNotEquals"]["aws:PrincipalArn"]) == sorted(readers)
