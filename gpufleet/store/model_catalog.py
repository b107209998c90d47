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
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet import tables as keys
from gpufleet.errors import ValidationFailed
from gpufleet.models.limits import TINY_MODEL

#: models the runtime builds itself (not published, not in the catalog, not pinned)
BUILTIN_MODELS = frozenset({TINY_MODEL})
#: the job item attribute holding the content hash its model must have
MODEL_HASH = "model_hash"
#: what the API reads of an entry (its role's projection)
READ_ATTRIBUTES = ("content_hash",)


class ModelCatalog(Protocol):
    def content_hash(self, name: str) -> str | None: ...


class DynamoModelCatalog:
    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb, self.table = ddb, table

    def content_hash(self, name: str) -> str | None:
        got = self.ddb.get_item(TableName=self.table, Key={"pk": {"S": keys.model_pk(name)}, "sk": {"S": keys.MODEL_SK}},
                                ProjectionExpression="content_hash").get("Item")
        value = (got or {}).get("content_hash", {}).get("S")
        return value or None


class MemoryModelCatalog:
    """The in-memory catalog of unit tests: ``{name: content_hash}``."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries = dict(entries or {})

    def content_hash(self, name: str) -> str | None:
        return self.entries.get(name)


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
