"""LambdaRunner runs a container-image function (PackageType Image) in-process from the image's staged build context."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from gpufleet.local.lambda_runner import LambdaRunner
from gpufleet.local.moto_patches import patch_lambda
from infra.lambda_asset import build_lambda_asset

REGION = "us-east-1"
REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-hnb659fds-container-assets-123456789012-us-east-1"


def test_local_runner_invokes_image_functions_by_command_from_the_tagged_asset(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    # the zip asset has the same layout as an image's build context (lambdas/..., gpufleet/...)
    runner = LambdaRunner({"imagedigest": build_lambda_asset()}, region=REGION)
    env = {"GPUFLEET_WEBHOOK_QUEUE_URL": "https://sqs.invalid/q", "GPUFLEET_FUNCTION": "webhook_events"}
    handler = ["lambdas.tasks.webhook_events.handler"]
    with mock_aws(), patch_lambda(runner):
        role = boto3.client("iam", region_name=REGION).create_role(
            RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam = boto3.client("lambda", region_name=REGION)

        def create(name, image=f"{REPO}:imagedigest", **kwargs):
            lam.create_function(FunctionName=name, Role=role, PackageType="Image", Code={"ImageUri": image},
                                Environment={"Variables": env}, **kwargs)

        create("by-command", ImageConfig={"Command": handler})
        create("unnamed")
        create("missing", ImageConfig={"Command": ["lambdas.tasks.no_such_module.handler"]})
        create("foreign", image=f"{REPO}:otherdigest", ImageConfig={"Command": handler})
        create("untagged", image=REPO, ImageConfig={"Command": handler})
        out = lam.invoke(FunctionName="by-command", Payload=json.dumps({"Records": []}))
        assert "FunctionError" not in out
        assert json.loads(out["Payload"].read()) == {"batchItemFailures": []}
        for name, message in (("unnamed", "names no handler"), ("missing", "not in the deployed asset"),
                              ("foreign", "not an asset of this assembly"), ("untagged", "no tag")):
            out = lam.invoke(FunctionName=name, Payload=json.dumps({"Records": []}))
            body = json.loads(out["Payload"].read())
            assert out.get("FunctionError") and body["errorType"] == "ConfigError", name
            assert message in body["errorMessage"], (name, body["errorMessage"])
    assert [i.errored for i in runner.invocations] == [False, True, True, True, True]
