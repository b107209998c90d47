"""The model names a node-cache entry holds: what the agent advertises and the scheduler matches.

A job names its model as the spec does (``spec.workload.model``, e.g. ``wan-tiny``); the node
cache keys model folders by content hash (``<cache>/models/sha256/<hash>``). So that the node's
``cached_models`` and the job's model are one identifier, the loader records in each cached
folder the name(s) it was resolved from, in ``.names.json`` (a dot file: outside the folder's
content hash), and the agent advertises those names. Recording is atomic (temp file + rename)
and best-effort: two jobs naming one folder at once may leave one name out until the next load.

Staged inputs (``<cache>/blobs/<sha256>``, files) record theirs the same way in a sidecar,
``<cache>/inputs/<sha256>`` (:mod:`gpufleet.runtime.staging`): the ``s3://`` URIs, as the spec wrote them,
the blob was staged for. :func:`read_names` and :func:`add_name` work on any such names file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

NAMES_FILE = ".names.json"


def read_names(path: Path) -> list[str]:
    """The names in the JSON names file ``path`` (empty when none or unreadable)."""
    try:
        names = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def add_name(path: Path, name: str) -> None:
    """Add ``name`` to the names file ``path`` (no-op when present or its folder is gone); atomic, best effort."""
    path = Path(path)
    names = read_names(path)
    if name in names:
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=".names-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(sorted({*names, name}), fh)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def recorded_names(entry: Path) -> list[str]:
    """The model names recorded in a cache entry (empty when none or unreadable)."""
    return read_names(Path(entry) / NAMES_FILE)


def record_name(entry: Path, name: str) -> None:
    """Add ``name`` to the names of the cache folder ``entry`` (no-op when present or the folder is gone)."""
    add_name(Path(entry) / NAMES_FILE, name)
