"""The model catalog's registration rule: which content hash an operator's registration of a model records.

The catalog (control table ``MODEL#<name>`` / ``MODEL``, :func:`gpufleet.tables.model_pk`) lists the models jobs may
name, each with the content hash jobs of it run (the SHA-256 of its manifest, what
:func:`gpufleet.models.loader.folder_sha256` computes of a folder and what a published ``manifest.json`` hashes to).
Operators register models through the administration API (``PUT /v1/admin/models/{name}``, audited); submission reads
the entry's ``content_hash`` (:mod:`gpufleet.store.model_catalog`).

Contract:
- :func:`name_problem` is the rule a catalog name follows, the loader's (no ``/``, no leading ``.``) plus the CLI's (1 to
  ``LIMITS["model_max_chars"]`` printable characters, no surrounding spaces); the built-in model
  (:data:`gpufleet.models.limits.TINY_MODEL`) is never registered (the runtime builds it; jobs name it freely).
- :func:`parse_manifest` reads a published ``manifest.json`` (``{"files": {relpath: sha256}}``) into a
  :class:`Published` (its SHA-256 and file count); anything else is a :class:`~gpufleet.errors.Conflict`.
- :func:`registration` decides (pure) what a registration records: with a published manifest, its hash (a given hash
  that differs: 409 naming both) and ``source: published``; without one, the given hash (``source: local``: a model
  only on nodes' local model roots), and no given hash is a 404 saying so.
- :class:`Manifests` is what a registration reads the published manifests through: its S3 adapter is
  :class:`gpufleet.store.model_catalog.S3Manifests`, :class:`NoManifests` a deployment without a models root.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpufleet.errors import Conflict, NotFound, ValidationFailed
from gpufleet.models.limits import TINY_MODEL
from gpufleet.spec import LIMITS

HASH_PATTERN = r"^[0-9a-f]{64}$"
_HASH = re.compile(HASH_PATTERN)
#: the manifests a published model's folder holds (and all the administration API may read of the models bucket)
MANIFEST = "manifest.json"
MAX_NAME = int(LIMITS["model_max_chars"])
#: a manifest larger than this is not one (a model of a hundred thousand files stays far below)
MAX_MANIFEST_BYTES = 16 * 1024 * 1024

Source = Literal["published", "local"]


def name_problem(name: str, *, registering: bool = True) -> str | None:
    """Why ``name`` cannot be a catalog entry's name (``registering``: nor be registered, the built-in model), or None
    (pure)."""
    if not name or "/" in name or name.startswith(".") or len(name) > MAX_NAME or not name.isprintable() \
            or name.strip() != name:
        return (f"{name!r} cannot name a model (no '/', no leading '.', 1 to {MAX_NAME} printable characters, no "
                "surrounding spaces)")
    if registering and name == TINY_MODEL:
        return f"{TINY_MODEL} is built in: jobs name it without a catalog entry, and it is never registered"
    return None


def checked_name(name: str, *, registering: bool = True) -> str:
    """``name``, or ValidationFailed (400) saying why it cannot be (registered as) a catalog entry."""
    problem = name_problem(name, registering=registering)
    if problem:
        raise ValidationFailed(problem, field="name")
    return name


def is_hash(value: str) -> bool:
    return bool(_HASH.match(value or ""))


@dataclass(frozen=True)
class Published:
    """A published model's manifest: its SHA-256 (the content hash) and the files it names."""

    content_hash: str
    files: int


def parse_manifest(name: str, raw: bytes) -> Published:
    """``raw`` (a ``manifest.json``) as a :class:`Published`, or Conflict when it is not a model manifest (pure)."""
    try:
        files = json.loads(raw).get("files")
    except (ValueError, AttributeError):
        files = None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) and is_hash(v)
                                              for k, v in files.items()):
        raise Conflict(f"the published manifest of model {name!r} is not a model manifest "
                       "({\"files\": {path: sha256}}): publish the model again")
    return Published(hashlib.sha256(raw).hexdigest(), len(files))


def registration(name: str, given: str | None, published: Published | None, where: str) -> dict[str, Any]:
    """What registering ``name`` records (``content_hash``, ``files``, ``bytes``, ``source``), given the hash the
    operator gave (or None) and the published manifest (or None); ``where`` names the models root in messages."""
    if published is not None:
        if given is not None and given != published.content_hash:
            raise Conflict(f"model {name!r} is published under {where} with content hash {published.content_hash}, "
                           f"not {given}: publish the content you mean, or register without a hash")
        return {"content_hash": published.content_hash, "files": published.files, "bytes": 0, "source": "published"}
    if given is None:
        raise NotFound(f"model {name!r} is not published under {where}: publish it first, or give its content_hash "
                       "(a model on the nodes' local model roots: gpufleet admin models register NAME --folder PATH)")
    return {"content_hash": given, "files": 0, "bytes": 0, "source": "local"}


class Manifests(Protocol):
    """The published models' manifests: ``root`` (``s3://bucket/prefix/``, "" when the deployment has none) and
    ``read(name)``: the raw ``manifest.json``, None when not published."""

    root: str

    def read(self, name: str) -> bytes | None: ...


class NoManifests:
    """A deployment without a models root: nothing is published."""

    root = ""

    def read(self, name: str) -> bytes | None:
        return None
