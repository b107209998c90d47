"""LambdaRunner runs a container-image function (PackageType Image) in-process from the assembly's asset."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from gpufleet.local.lambda_runner import LambdaRunner
from gpufleet.local.moto_patches import patch_lambda
from infra.lambda_asset import build_lambda_asset

REGION = "us-east-1"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-assets:abc"


def test_local_runner_invokes_image_functions_by_command_or_env(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    runner = LambdaRunner({"zipdigest": build_lambda_asset()}, region=REGION)
    env = {"GPUFLEET_WEBHOOK_QUEUE_URL": "https://sqs.invalid/q", "GPUFLEET_FUNCTION": "webhook_events"}
    with mock_aws(), patch_lambda(runner):
        role = boto3.client("iam", region_name=REGION).create_role(
            RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam = boto3.client("lambda", region_name=REGION)
        common = {"Role": role, "PackageType": "Image", "Code": {"ImageUri": IMAGE}}
        lam.create_function(FunctionName="by-command", Environment={"Variables": env},
                            ImageConfig={"Command": ["lambdas.tasks.webhook_events.handler"]}, **common)
        lam.create_function(FunctionName="by-env", **common, Environment={
            "Variables": {**env, "GPUFLEET_HANDLER": "lambdas.tasks.webhook_events.handler"}})
        lam.create_function(FunctionName="unnamed", Environment={"Variables": env}, **common)
        lam.create_function(FunctionName="missing", Environment={"Variables": env},
                            ImageConfig={"Command": ["lambdas.tasks.no_such_module.handler"]}, **common)
        for name in ("by-command", "by-env"):
            out = lam.invoke(FunctionName=name, Payload=json.dumps({"Records": []}))
            assert "FunctionError" not in out, name
            assert json.loads(out["Payload"].read()) == {"batchItemFailures": []}
        for name, message in (("unnamed", "names no handler"), ("missing", "is in no asset")):
            out = lam.invoke(FunctionName=name, Payload=json.dumps({"Records": []}))
            body = json.loads(out["Payload"].read())
            assert out.get("FunctionError") and body["errorType"] == "ConfigError" and message in body["errorMessage"]
    assert [i.errored for i in runner.invocations] == [False, False, True, True]
