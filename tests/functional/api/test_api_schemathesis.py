"""schemathesis against the local gateway over loopback, every request SigV4-signed.

Properties (for a bounded number of generated requests per operation): no 5xx,
every status code, content type, header and body is the one the OpenAPI
document declares, and every signed request passes the gateway's signature check.
"""

from __future__ import annotations

import boto3
import pytest
import requests
import schemathesis
from api_helpers import ALICE, KEYS, REGION, SECRET, VIDEO, register_principals
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, settings
from moto import mock_aws
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpufleet.api.app import build_openapi
from gpufleet.api.settings import load
from gpufleet.api.wiring import build_api
from gpufleet.clock import FakeClock, SystemClock
from gpufleet.devstack.gateway import Gateway, LocalCredential
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

pytestmark = pytest.mark.xdist_group("api-schemathesis")

SCHEMA = schemathesis.openapi.from_dict(build_openapi(build_api(load(cursor_secret=SECRET), ddb=None, clock=FakeClock()).app))
SCHEMA.config.phases.update(phases=["examples", "fuzzing"])
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


class SigV4RequestsAuth(requests.auth.AuthBase):
    """Sign a prepared ``requests`` request with SigV4 for execute-api (what the SDK does)."""

    def __init__(self, akid: str, secret: str) -> None:
        self.creds = Credentials(akid, secret)

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        body = r.body.encode() if isinstance(r.body, str) else (r.body or b"")
        req = AWSRequest(method=r.method, url=r.url, data=body, headers={"Host": r.url.split("/")[2]})
        SigV4Auth(self.creds, "execute-api", REGION).add_auth(req)
        for k in ("Authorization", "X-Amz-Date"):
            r.headers[k] = req.headers[k]
        r.headers["Host"] = req.headers["Host"]
        return r


@pytest.fixture(scope="module")
def live():
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        for b in ("gpufleet-outputs", "gpufleet-logs"):
            s3.create_bucket(Bucket=b)
        names = TableNames()
        create_tables(ddb, names)
        register_principals(ddb, names.control)
        settings = load(cursor_secret=SECRET, idempotency_wait_s=0.1)
        sfn, batch = boto3.client("stepfunctions", region_name=REGION), boto3.client("batch", region_name=REGION)
        creds = [
            LocalCredential(access_key_id=a, secret_access_key=s, principal_arn=arn) for arn, (a, s) in KEYS.items()
        ]
        with Gateway(lambda: build_api(settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, clock=SystemClock()).handle, creds, region=REGION) as gw:
            session = requests.Session()
            session.auth = SigV4RequestsAuth(*KEYS[ALICE])
            seeded = session.post(f"{gw.url}/v1/jobs", json=VIDEO, headers={"Idempotency-Key": "seed"}, timeout=30)
            assert seeded.status_code == 202
            yield gw, session


@SCHEMA.parametrize()
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case, live):
    gw, session = live
    response = case.call(base_url=gw.url, session=session, timeout=30)
    assert response.status_code != 403, f"signed request rejected: {response.text}"
    case.validate_response(response, checks=CHECKS)
