"""The model names a node-cache entry holds: what the agent advertises and the scheduler matches.

A job names its model as the spec does (``spec.workload.model``, e.g. ``wan-tiny``); the node
cache keys model folders by content hash (``<cache>/models/sha256/<hash>``). So that the node's
``cached_models`` and the job's model are one identifier, the loader records in each cached
folder the name(s) it was resolved from, in ``.names.json`` (a dot file: outside the folder's
content hash), and the agent advertises those names. Recording is atomic (temp file + rename)
and best-effort: two jobs naming one folder at once may leave one name out until the next load.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

NAMES_FILE = ".names.json"


def recorded_names(entry: Path) -> list[str]:
    """The model names recorded in a cache entry (empty when none or unreadable)."""
    try:
        names = json.loads((Path(entry) / NAMES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def record_name(entry: Path, name: str) -> None:
    """Add ``name`` to the names of the cache folder ``entry`` (no-op when present or the folder is gone)."""
    entry = Path(entry)
    names = recorded_names(entry)
    if name in names:
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=".names-", dir=entry)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(sorted({*names, name}), fh)
        os.replace(tmp, entry / NAMES_FILE)
    except OSError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
