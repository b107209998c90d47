"""The real SigV4 gateway in front of the real API handler on in-process moto (helper of the CLI and
SDK tests that talk to the real API): tables, principals, optional buckets, one credential each."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from fast_moto import fast_mock_aws

REGION = "us-east-1"


@dataclass(frozen=True)
class User:
    arn: str
    tenant: str
    team: str
    user: str
    key: str
    secret: str


@contextmanager
def real_api(users: list[User], *, buckets: tuple[str, ...] = (), **settings: Any) -> Iterator[dict[str, Any]]:
    """Yield ``{"gw", "ddb", "names"}``: the gateway serving the API (settings ``load(**settings)``) for ``users``."""
    with pytest.MonkeyPatch.context() as mp, fast_mock_aws():
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": REGION}.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("GPUFLEET_ENDPOINT", raising=False)
        from gpufleet.api.settings import load
        from gpufleet.api.wiring import build_api
        from gpufleet.clock import SystemClock
        from gpufleet.devstack.gateway import Gateway, LocalCredential
        from gpufleet.store.principals import put_principal
        from gpufleet.store.schema import create_tables
        from gpufleet.tables import TableNames

        ddb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        names = TableNames()
        create_tables(ddb, names)
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        for u in users:
            put_principal(ddb, names.control, u.arn, u.tenant, u.team, u.user)
        api_settings, sfn, batch = load(**settings), boto3.client("stepfunctions", region_name=REGION), \
            boto3.client("batch", region_name=REGION)
        creds = [LocalCredential(access_key_id=u.key, secret_access_key=u.secret, principal_arn=u.arn) for u in users]
        with Gateway(lambda: build_api(api_settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, clock=SystemClock()).handle, creds, region=REGION) as gw:
            yield {"gw": gw, "ddb": ddb, "names": names}
