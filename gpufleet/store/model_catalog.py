"""What submission reads of the model catalog: the content hash a registered model's jobs run.

The catalog (control table ``MODEL#<name>`` / ``MODEL``, :func:`gpufleet.tables.model_pk`) lists the models jobs may
name, each with the content hash of its files (the SHA-256 of its manifest, :func:`gpufleet.models.loader.folder_sha256`),
registered by an operator through the administration API (``PUT /v1/admin/models/{name}``; audited, the API's role
cannot write it).

Contract:
- :func:`pinned_model` is submission's rule (``POST /v1/jobs``, ``POST /v1/job-arrays``): a ``video.generate`` job
  naming a built-in model (:data:`BUILTIN_MODELS`: built offline by the runtime, never published) needs no entry and
  is not pinned; any other model must be registered, else 400 ``validation`` naming ``workload.model``, and the
  job stores the entry's hash as ``model_hash`` (:data:`MODEL_HASH`), which no role may change afterwards
  (``infra.grants.IMMUTABLE_JOB_ATTRIBUTES``). The runtime runs only content with that hash
  (:class:`gpufleet.models.loader.ModelChanged`): whoever writes the models bucket alone cannot change what an
  admitted job runs. A container job names no model: nothing to pin.
- :meth:`ModelCatalog.content_hash` reads one entry (projected: the API's role reads nothing else of it); None when
  the model is not registered.
- :meth:`ModelCatalog.entries` lists the catalog for tenants (``GET /v1/models``) through the directory index
  (``DIR#MODELS``), projected to :data:`LIST_ATTRIBUTES` (never who registered a model), by name.
- :class:`S3Manifests` is how the administration API reads a published model's ``<root><name>/manifest.json`` when an
  operator registers it (:mod:`gpufleet.models.catalog`; ``s3:GetObject`` of manifests only: no listing, so S3
  answers a missing key with 403 as well as 404; both mean "not published"). Throttling and 5xx are
  :class:`~gpufleet.errors.TransientError`, other refusals :class:`~gpufleet.errors.DependencyFailed`, a manifest
  over :data:`gpufleet.models.catalog.MAX_MANIFEST_BYTES` a :class:`~gpufleet.errors.Conflict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet import tables as keys
from gpufleet.errors import Conflict, DependencyFailed, TransientError, ValidationFailed
from gpufleet.models.catalog import MANIFEST, MAX_MANIFEST_BYTES
from gpufleet.models.limits import TINY_MODEL
from gpufleet.store.dynamo import paginate
from gpufleet.store.objectstore import parse_s3_uri

#: models the runtime builds itself (not published, not in the catalog, not pinned)
BUILTIN_MODELS = frozenset({TINY_MODEL})
#: the job item attribute holding the content hash its model must have
MODEL_HASH = "model_hash"
#: what the API reads of an entry (its role's projection)
READ_ATTRIBUTES = ("content_hash",)
#: what a tenant's listing reads of each entry (the API role's projection of the directory query)
LIST_ATTRIBUTES = ("name", "content_hash", "source", "files")


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    content_hash: str
    source: str = "published"
    files: int = 0


class ModelCatalog(Protocol):
    def content_hash(self, name: str) -> str | None: ...

    def entries(self) -> list[CatalogEntry]: ...


class DynamoModelCatalog:
    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb, self.table = ddb, table

    def content_hash(self, name: str) -> str | None:
        got = self.ddb.get_item(TableName=self.table, Key={"pk": {"S": keys.model_pk(name)}, "sk": {"S": keys.MODEL_SK}},
                                ProjectionExpression="content_hash").get("Item")
        value = (got or {}).get("content_hash", {}).get("S")
        return value or None

    def entries(self) -> list[CatalogEntry]:
        names = {f"#a{i}": a for i, a in enumerate(LIST_ATTRIBUTES)}
        out: list[CatalogEntry] = []
        for row in paginate(self.ddb.query, TableName=self.table, IndexName=keys.DIRECTORY_INDEX,
                             KeyConditionExpression="#d = :d", ProjectionExpression=", ".join(names),
                             ExpressionAttributeNames={"#d": keys.DIRECTORY_ATTR, **names},
                             ExpressionAttributeValues={":d": {"S": keys.DIR_MODELS}}):
            if row.get("name") and row.get("content_hash"):
                out.append(CatalogEntry(str(row["name"]), str(row["content_hash"]),
                                        str(row.get("source") or "published"), int(row.get("files") or 0)))
        return sorted(out, key=lambda e: e.name)


class MemoryModelCatalog:
    """The in-memory catalog of unit tests: ``{name: content_hash}``."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.by_name = dict(entries or {})

    def content_hash(self, name: str) -> str | None:
        return self.by_name.get(name)

    def entries(self) -> list[CatalogEntry]:
        return [CatalogEntry(n, h) for n, h in sorted(self.by_name.items())]


def pinned_model(catalog: ModelCatalog | None, workload: Any) -> dict[str, str]:
    """The job attributes that pin ``workload``'s model (``{MODEL_HASH: hash}``, or ``{}``: nothing to pin); raises
    ValidationFailed for a model that is neither built in nor registered. ``catalog`` None: an empty catalog."""
    if getattr(workload, "kind", None) != "video.generate" or workload.model in BUILTIN_MODELS:
        return {}
    digest = catalog.content_hash(workload.model) if catalog is not None else None
    if digest is None:
        raise ValidationFailed(
            f"model {workload.model!r} is not in this deployment's model catalog (built in: "
            f"{', '.join(sorted(BUILTIN_MODELS))}; an operator registers models: gpufleet admin models)",
            field="workload.model")
    return {MODEL_HASH: digest}


_ABSENT = {"NoSuchKey", "NotFound", "404", "AccessDenied", "403"}


class S3Manifests:
    """:class:`gpufleet.models.catalog.Manifests` under ``root`` (see the module contract for what a missing key answers)."""

    def __init__(self, client: Any, root: str) -> None:
        self.client = client
        self.root = root
        self.bucket, self.prefix, _ = parse_s3_uri(root)

    def read(self, name: str) -> bytes | None:
        key = f"{self.prefix}{name}/{MANIFEST}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _ABSENT or status in (403, 404):
                return None
            if status >= 500 or code in ("SlowDown", "RequestTimeout", "ThrottlingException"):
                raise TransientError(f"reading s3://{self.bucket}/{key}: {code}") from err
            raise DependencyFailed(f"reading s3://{self.bucket}/{key}: {code}") from err
        if int(resp.get("ContentLength") or 0) > MAX_MANIFEST_BYTES:
            raise Conflict(f"the published manifest of model {name!r} is larger than {MAX_MANIFEST_BYTES} bytes")
        return resp["Body"].read()
