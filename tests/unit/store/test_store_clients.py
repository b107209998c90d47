"""The one client factory's own sessions (gpufleet.store.clients.botocore_session): one data loader per process,
credentials per session."""

from __future__ import annotations

from gpufleet.store.clients import botocore_session, client


def test_sessions_share_the_process_data_loader_and_keep_their_own_credentials():
    a, b = botocore_session(), botocore_session()
    assert a is not b
    assert a.get_component("data_loader") is b.get_component("data_loader")  # S3's model parsed once per process
    a.set_credentials("AKIDA", "secret-a")
    b.set_credentials("AKIDB", "secret-b")
    assert a.get_credentials().access_key == "AKIDA" and b.get_credentials().access_key == "AKIDB"
    import boto3

    s3 = client("s3", region="us-east-1", session=boto3.Session(botocore_session=a))
    assert s3._request_signer._credentials.access_key == "AKIDA"  # noqa: SLF001 - the client signs as its session
