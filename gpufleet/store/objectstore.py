"""S3 adapter of the runtime, model loader and finalize stage (they reach S3 only through it).

Contract: :class:`ObjectStore` wraps a boto3 ``s3`` client (injected; built from
the environment when ``client=None``). ``ClientError`` never escapes: a missing
object becomes :class:`gpufleet.errors.NotFound`, throttling and 5xx become
:class:`gpufleet.errors.TransientError`. Puts are whole-object, so a reader
never sees a partial object (S3 PUT is atomic).

On an on-prem node every PUT carries the object tag ``gpufleet:node=<node id>``
(:data:`NODE_TAG_KEY`): the agent role may write job objects only so tagged
(infra/onprem.py, ``WriteOwnTaggedObjects``). ``node_id`` is that id (the runtime's
``GPUFLEET_NODE_ID`` setting, set by the agent, passed down by the runtime's entry point and, in
:class:`gpufleet.runtime.ckptproc.CheckpointTarget`, to the checkpoint writer process); ``""``
means untagged (Batch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

from botocore.exceptions import ClientError

from gpufleet.errors import DependencyFailed, NotFound, TransientError

#: object tag naming the on-prem node that wrote an object (the agent policy's condition key)
NODE_TAG_KEY = "gpufleet:node"
_MISSING = {"NoSuchKey", "404", "NotFound", "NoSuchBucket", "NoSuchVersion"}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_s3_uri(uri: str) -> tuple[str, str, str | None]:
    """``s3://bucket/key[?versionId=v]`` → (bucket, key, version or None)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3 uri: {uri!r}")
    rest, _, version = uri[5:].partition("?versionId=")
    bucket, _, key = rest.partition("/")
    return bucket, key, version or None


class ObjectStore:
    def __init__(self, client=None, node_id: str = "") -> None:
        if client is None:
            from gpufleet.store.clients import client as make_client

            client = make_client("s3")
        self.client = client
        self.node_id = node_id

    @property
    def tagging(self) -> str | None:
        """The ``Tagging`` value (URL-encoded query string) every PUT sends, None when untagged."""
        return urlencode({NODE_TAG_KEY: self.node_id}, quote_via=quote) if self.node_id else None

    def _call(self, what: str, fn, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _MISSING or status == 404:
                raise NotFound(f"{what}: s3://{kwargs.get('Bucket')}/{kwargs.get('Key', kwargs.get('Prefix', ''))}")
            if status >= 500 or code in ("SlowDown", "RequestTimeout", "ThrottlingException"):
                raise TransientError(f"{what}: {code}")
            raise DependencyFailed(f"{what}: {code}") from err

    def put_bytes(self, bucket: str, key: str, data: bytes, metadata: dict[str, str] | None = None,
                  content_type: str = "application/octet-stream") -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": data, "Metadata": metadata or {},
                                  "ContentType": content_type}
        if self.tagging:
            kwargs["Tagging"] = self.tagging
        return self._call("put", self.client.put_object, **kwargs)

    def get_bytes(self, bucket: str, key: str, version: str | None = None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            kwargs["VersionId"] = version
        return self._call("get", self.client.get_object, **kwargs)["Body"].read()

    def head(self, bucket: str, key: str, version: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            kwargs["VersionId"] = version
        return self._call("head", self.client.head_object, **kwargs)

    def move_out_of_reach(self, bucket: str, key: str, dest_key: str) -> bool:
        """Copy ``key`` to ``dest_key`` (same bucket), then delete the copied version of ``key`` for good (in a
        versioned bucket that version is removed, not hidden behind a delete marker). Idempotent: a source
        already gone returns False and does nothing; True when moved now."""
        try:
            resp = self._call("copy", self.client.copy_object, Bucket=bucket, Key=dest_key,
                              CopySource={"Bucket": bucket, "Key": key})
        except NotFound:
            return False
        version = resp.get("CopySourceVersionId")
        if version and version != "null":
            self._call("delete", self.client.delete_object, Bucket=bucket, Key=key, VersionId=version)
        else:
            self._call("delete", self.client.delete_object, Bucket=bucket, Key=key)
        return True

    def delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` (in a versioned bucket: a delete marker; its versions stay until the lifecycle expires them)."""
        self._call("delete", self.client.delete_object, Bucket=bucket, Key=key)

    def exists(self, bucket: str, key: str) -> bool:
        try:
            self.head(bucket, key)
        except NotFound:
            return False
        return True

    def list_keys(self, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
        """Yield (key, size) under ``prefix`` in key order."""
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call("list", self.client.list_objects_v2, **kwargs)
            for obj in resp.get("Contents", []):
                yield obj["Key"], int(obj["Size"])
            if not resp.get("IsTruncated"):
                return
            token = resp["NextContinuationToken"]

    def download_to(self, bucket: str, key: str, fileobj, version: str | None = None) -> int:
        """Stream an object into ``fileobj``; returns the bytes written."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            kwargs["VersionId"] = version
        body = self._call("get", self.client.get_object, **kwargs)["Body"]
        n = 0
        for chunk in iter(lambda: body.read(1 << 20), b""):
            fileobj.write(chunk)
            n += len(chunk)
        return n
