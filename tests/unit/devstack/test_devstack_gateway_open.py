"""The dev gateway's API Gateway behaviours for cloud supervisors: a method without authorization (the node API's
token exchange) is served unsigned with no caller, every other route still needs a signature, and a session moto's
STS vended for the supervisor role is accepted with its assumed-role ARN (another role's is not)."""

from __future__ import annotations

import json

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from moto import mock_aws

from gpufleet.devstack.gateway import Gateway, moto_sessions

OPEN = ("POST", "/v1/node/cloud/credentials")
HOST = "127.0.0.1:9"


def gateway(resolve=None):
    seen = []

    def handler(event, context):
        seen.append(event)
        return {
            "statusCode": 200,
            "headers": {},
            "body": json.dumps({"who": event["requestContext"]["identity"]["userArn"]}),
        }

    return Gateway(lambda: handler, [], open_routes=[OPEN], resolve=resolve), seen


def test_an_open_route_is_served_unsigned_with_no_caller_and_only_it():
    gw, seen = gateway()
    try:
        status, _, body = gw.serve("POST", "/v1/node/cloud/credentials", {"Host": HOST}, b"{}")
        assert status == 200 and json.loads(body) == {"who": None}
        status, _, _ = gw.serve("POST", "/v1/node/jobs/j1/attempts/1/view", {"Host": HOST}, b"{}")
        assert status == 403 and len(seen) == 1  # never reached the handler
        status, _, _ = gw.serve("GET", "/v1/node/cloud/credentials", {"Host": HOST}, b"")
        assert status == 403
    finally:
        gw._server.server_close()


def _signed(creds: dict, path: str) -> dict:
    req = AWSRequest(
        method="POST", url=f"http://{HOST}{path}", data=b"{}", headers={"Content-Type": "application/json"}
    )
    SigV4Auth(
        Credentials(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"]), "execute-api", "us-east-1"
    ).add_auth(req)
    return {"Host": HOST, **dict(req.headers.items())}


def test_a_supervisor_role_session_is_accepted_with_its_assumed_role_arn(monkeypatch):
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        sts = boto3.client("sts", region_name="us-east-1")
        sup_role, other = "arn:aws:iam::123456789012:role/CloudSupervisorRole", "arn:aws:iam::123456789012:role/Other"
        sup = sts.assume_role(RoleArn=sup_role, RoleSessionName="sup-e2-j1")["Credentials"]
        foreign = sts.assume_role(RoleArn=other, RoleSessionName="sup-e2-j1")["Credentials"]
        gw, _ = gateway(moto_sessions([sup_role], "123456789012"))
        try:
            path = "/v1/node/jobs/j1/attempts/2/view"
            status, _, body = gw.serve("POST", path, _signed(sup, path), b"{}")
            assert status == 200
            assert json.loads(body)["who"] == "arn:aws:sts::123456789012:assumed-role/CloudSupervisorRole/sup-e2-j1"
            assert gw.serve("POST", path, _signed(foreign, path), b"{}")[0] == 403
            forged = {**sup, "SecretAccessKey": "not-the-secret"}
            assert gw.serve("POST", path, _signed(forged, path), b"{}")[0] == 403
        finally:
            gw._server.server_close()
