"""Fixtures of the local-emulation tests: AWS test credentials and small moto helpers."""

from __future__ import annotations

import io
import json
import os
import zipfile

import boto3
import pytest

for _k, _v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_k, _v)

REGION = "us-east-1"


def code_zip(source: str = "def handler(event, context):\n    return event\n") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("probe.py", source)
    return buf.getvalue()


@pytest.fixture(scope="module")
def local_stack():
    """The synthesized stack deployed into in-process moto (module scope: moto and the patches must not
    outlive the module, other tests of the worker use their own moto)."""
    from gpufleet.local.harness import LocalStack

    with LocalStack() as stack:
        yield stack


@pytest.fixture
def role_arn():
    """An IAM role in the current moto world (call inside mock_aws)."""

    def make(name: str = "local-test") -> str:
        doc = json.dumps({"Version": "2012-10-17", "Statement": []})
        return boto3.client("iam", region_name=REGION).create_role(RoleName=name, AssumeRolePolicyDocument=doc)[
            "Role"
        ]["Arn"]

    return make
