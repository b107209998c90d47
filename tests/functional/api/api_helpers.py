"""Shared helpers of the API functional tests (constants, callers, signed requests).

A uniquely named module (not conftest) so that ``from api_helpers import ...`` cannot pick up
another directory's conftest.
"""

from __future__ import annotations

REGION = "us-east-1"
ACCOUNT = "123456789012"
ALICE = f"arn:aws:iam::{ACCOUNT}:user/alice"  # t1/vision/alice
BOB = f"arn:aws:iam::{ACCOUNT}:user/bob"  # t1/vision/bob
CAROL = f"arn:aws:iam::{ACCOUNT}:user/carol"  # t2/audio/carol (another tenant)
STRANGER = f"arn:aws:iam::{ACCOUNT}:user/mallory"  # not registered
SECRET = "cursor-secret-for-tests-0123456789"
VIDEO = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}


class Caller:
    """Calls the API handler with REST proxy events the way API Gateway would."""

    def __init__(self, api):
        self.api = api

    def __call__(self, method, path, body=None, *, headers=None, arn=ALICE):
        import json as _json

        from gpufleet.devstack.gateway import build_event

        raw = b"" if body is None else (body if isinstance(body, bytes) else _json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        resp = self.api.handle(build_event(method, path, hdrs, raw, user_arn=arn), None)
        return Result(resp)


class Result:
    def __init__(self, resp):
        import json as _json

        self.raw = resp
        self.status = resp["statusCode"]
        hs = dict(resp.get("headers") or {})
        for k, v in (resp.get("multiValueHeaders") or {}).items():
            hs.setdefault(k, v[-1])
        self.headers = {k.lower(): v for k, v in hs.items()}
        self.text = resp.get("body") or ""
        self.json = _json.loads(self.text) if self.text else None


def register_principals(ddb, table):
    from gpufleet.store.principals import put_principal

    put_principal(ddb, table, ALICE, "t1", "vision", "alice")
    put_principal(ddb, table, BOB, "t1", "vision", "bob")
    put_principal(ddb, table, CAROL, "t2", "audio", "carol")


KEYS = {
    ALICE: ("AKIAALICE0000000001", "alice-secret-000000000000000000000000000"),
    BOB: ("AKIABOB00000000000001", "bob-secret-0000000000000000000000000000"),
    CAROL: ("AKIACAROL0000000001", "carol-secret-000000000000000000000000000"),
    STRANGER: ("AKIAMALLORY00000001", "mallory-secret-00000000000000000000000"),
}


def signed_request(method, url, body=None, *, arn=ALICE, headers=None, key=None, service="execute-api", region=REGION):
    """Send a SigV4-signed request (botocore) over loopback; returns the requests.Response."""
    import json as _json

    import requests
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    akid, secret = key or KEYS[arn]
    data = None if body is None else (body if isinstance(body, bytes) else _json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = AWSRequest(method=method, url=url, data=data, headers=hdrs)
    SigV4Auth(Credentials(akid, secret), service, region).add_auth(req)
    return requests.request(method, url, data=data, headers=dict(req.headers.items()), timeout=30)
