"""The published models' home in the deployment: a models bucket whose ``models/`` prefix is the runtime's, the node
API's and the agents' ``GPUFLEET_MODEL_S3_ROOT``, readable (``s3:GetObject`` only) by the run attempts' roles — the
GPU Batch definitions' run role, the node-job role on-prem runtimes' sessions are vended from, the cloud supervisor
role — and writable by no role of the template (operators publish with their own credentials). The administration
API's role reads published manifests only (a model registration records the manifest's hash: the model catalog)."""

from __future__ import annotations

import json

import pytest
from iam_matcher import Request, Template, allowed_by, resolve

pytestmark = pytest.mark.xdist_group("cdk-synth")

REGION, ACCOUNT = "us-east-1", "123456789012"
#: the roles whose attempts read published models
READERS = ("ComputeRunJobRole", "OnPremNodeJobRole", "OnPremCloudSupervisorRole")
WRITES = ("s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectTagging", "s3:PutObjectAcl",
          "s3:RestoreObject", "s3:PutBucketPolicy", "s3:PutLifecycleConfiguration")


def _of_type(tpl: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in tpl["Resources"].items() if r["Type"] == kind}


def _models_bucket(tpl: dict) -> str:
    (lid,) = [k for k in _of_type(tpl, "AWS::S3::Bucket") if k.startswith("DataModels")]
    return lid


def _root(tpl: dict) -> dict:
    """``s3://<models bucket>/models/`` as the template writes it."""
    return {"Fn::Join": ["", ["s3://", {"Ref": _models_bucket(tpl)}, "/models/"]]}


def _role(tpl: dict, prefix: str) -> str:
    (lid,) = [k for k in _of_type(tpl, "AWS::IAM::Role") if k.startswith(prefix)]
    return lid


def _arn(tpl: dict, key: str = "") -> str:
    return f"arn:aws:s3:::{Template(tpl, REGION, ACCOUNT).name(_models_bucket(tpl))}" + (f"/{key}" if key else "")


def test_the_models_bucket_is_versioned_encrypted_private_tls_only_and_logged(tpl):
    props = tpl["Resources"][_models_bucket(tpl)]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"}
    assert props["PublicAccessBlockConfiguration"] == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                       "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert props["LoggingConfiguration"]["LogFilePrefix"] == "models/"
    assert "DataAccessLogs" in json.dumps(props["LoggingConfiguration"]["DestinationBucketName"])
    (policy,) = [p["Properties"]["PolicyDocument"]["Statement"] for p in _of_type(tpl, "AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": _models_bucket(tpl)}]
    # its bucket policy only denies: plain HTTP; it grants nobody anything
    assert [s["Effect"] for s in policy] == ["Deny"]
    assert policy[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_the_models_root_is_an_output_and_the_runtimes_and_node_apis_setting(tpl):
    root = _root(tpl)
    assert tpl["Outputs"]["ModelsRoot"]["Value"] == root
    assert tpl["Outputs"]["ModelsBucket"]["Value"] == {"Ref": _models_bucket(tpl)}
    defs = {r["Properties"]["JobDefinitionName"]: r["Properties"] for r in _of_type(tpl, "AWS::Batch::JobDefinition").values()}

    def env(props: dict) -> dict:
        container = props.get("ContainerProperties") or props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        return {e["Name"]: e["Value"] for e in container.get("Environment", [])}

    # generate and container attempts (single and gang) find published models; finalize loads none
    assert env(defs["gpufleet-gpu"])["GPUFLEET_MODEL_S3_ROOT"] == root
    assert env(defs["gpufleet-gpu-gang"])["GPUFLEET_MODEL_S3_ROOT"] == root
    assert "GPUFLEET_MODEL_S3_ROOT" not in env(defs["gpufleet-cpu"])
    functions = {r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION"): r["Properties"]["Environment"]
                 ["Variables"] for r in _of_type(tpl, "AWS::Lambda::Function").values() if "Environment" in r["Properties"]}
    # the node API puts the root in every attempt session it vends (gpufleet.nodeapi.scope); the administration API
    # reads published manifests there (a model registration); no other function needs it
    assert functions["node_api"]["GPUFLEET_MODEL_S3_ROOT"] == root
    assert functions["admin_api"]["GPUFLEET_MODEL_S3_ROOT"] == root
    assert sorted(k for k, v in functions.items() if "GPUFLEET_MODEL_S3_ROOT" in v) == ["admin_api", "node_api"]


@pytest.mark.parametrize("role", READERS)
def test_the_attempt_roles_may_read_models_and_never_write_or_list_them(tpl, role):
    statements = Template(tpl, REGION, ACCOUNT).role_statements(_role(tpl, role))
    for key in ("models/wan-2.1/manifest.json", "models/wan-2.1/transformer/diffusion_pytorch_model.safetensors"):
        assert allowed_by(statements, Request("s3:GetObject", _arn(tpl, key))), (role, key)
    for action in WRITES:
        assert not allowed_by(statements, Request(action, _arn(tpl, "models/wan-2.1/manifest.json"))), (role, action)
    assert not allowed_by(statements, Request("s3:GetObject", _arn(tpl, "elsewhere/x.bin")))  # only under models/
    assert not allowed_by(statements, Request("s3:ListBucket", _arn(tpl), {"s3:prefix": ["models/"]}))


def _every_role(tpl: dict) -> dict[str, list[dict]]:
    """Each role's statements that could touch S3 (an ``s3:`` or ``*`` action), resolved (as
    :meth:`Template.role_statements` collects them: inline policies and ``AWS::IAM::Policy`` resources)."""
    resolved = Template(tpl, REGION, ACCOUNT)
    pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
              "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "Gpufleet"}
    out: dict[str, list[dict]] = {}
    for lid, role in _of_type(tpl, "AWS::IAM::Role").items():
        raw = [s for p in role["Properties"].get("Policies", []) for s in p["PolicyDocument"]["Statement"]]
        raw += [s for r in _of_type(tpl, "AWS::IAM::Policy").values() if {"Ref": lid} in r["Properties"].get("Roles", [])
                for s in r["Properties"]["PolicyDocument"]["Statement"]]
        touches = [s for s in raw if any(a == "*" or a.lower().startswith("s3:") for a in
                                         (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
        out[lid] = resolve(touches, resolved, {}, pseudo)
    return out


def _admin_api_role(tpl: dict) -> str:
    (fn,) = [r for r in _of_type(tpl, "AWS::Lambda::Function").values()
             if r["Properties"].get("Environment", {}).get("Variables", {}).get("GPUFLEET_FUNCTION") == "admin_api"]
    return fn["Properties"]["Role"]["Fn::GetAtt"][0]


def test_no_role_of_the_template_may_write_the_models_bucket_and_only_the_attempt_roles_read_it(tpl):
    """Model files: the attempt roles read them; manifests: those and the administration API's role (a registration
    records the manifest's hash)."""
    writers, readers, manifest_readers = [], set(), set()
    key = _arn(tpl, "models/wan-2.1/manifest.json")
    weights = _arn(tpl, "models/wan-2.1/transformer/diffusion_pytorch_model.safetensors")
    for lid, statements in _every_role(tpl).items():
        writers += [(lid, a) for a in WRITES for k in (key, weights) if allowed_by(statements, Request(a, k))]
        if allowed_by(statements, Request("s3:GetObject", weights)):
            readers.add(lid)
        if allowed_by(statements, Request("s3:GetObject", key)):
            manifest_readers.add(lid)
    assert writers == []
    assert {next(p for p in READERS if r.startswith(p)) for r in readers if r.startswith(READERS)} == set(READERS)
    assert all(r.startswith(READERS) for r in readers), readers
    assert manifest_readers == readers | {_admin_api_role(tpl)}, manifest_readers


def test_no_managed_policy_of_the_template_grants_s3(tpl):
    """The invoke policies the template hands out (administration, tenants) hold no object action at all."""
    for lid, policy in _of_type(tpl, "AWS::IAM::ManagedPolicy").items():
        actions = [a for s in policy["Properties"]["PolicyDocument"]["Statement"]
                   for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])]
        assert not [a for a in actions if a == "*" or a.lower().startswith("s3:")], lid
