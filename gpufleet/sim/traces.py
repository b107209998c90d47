"""Trace loaders: Alibaba openb (nodes, pods) and Microsoft Philly (jobs).

Contract: loaders read the traces' published CSV formats (openb: ``node_list``/``pod_list``
CSVs of the Alibaba cluster-trace-gpu-v2023 release; Philly: the job log's CSV export) and return plain dataclasses; a malformed row raises ``ValidationFailed`` naming
the file and line. ``gpu_spec`` of an openb pod is a ``|``-separated list of
acceptable GPU models (empty = any).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpufleet.errors import ValidationFailed
from gpufleet.scheduler.nodetable import MILLI, NodeTable, Request

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES = REPO_ROOT.parent / "shared" / "traces"
OPENB_NODES = TRACES / "openb_node_list_gpu_node.csv"
OPENB_PODS = TRACES / "openb_pod_list_default.csv"
PHILLY = TRACES / "philly.csv"


@dataclass(frozen=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


@dataclass(frozen=True)
class PhillyJob:
    submit_s: float  # seconds since the first submission in the trace
    duration_s: float
    num_gpus: int
    cluster: str


def _rows(path: Path, required: set[str]):
    try:
        fh = open(path, newline="")
    except OSError as err:
        raise ValidationFailed(f"cannot read trace {path}: {err}") from err
    with fh:
        reader = csv.DictReader(fh)
        missing = required - set(reader.fieldnames or [])
        if missing:
            raise ValidationFailed(f"{path}: missing columns {sorted(missing)}")
        yield from enumerate(reader, start=2)


def load_openb_nodes(path: Path = OPENB_NODES) -> list[OpenbNode]:
    out = []
    for ln, r in _rows(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}):
        try:
            out.append(OpenbNode(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"] or "none"))
        except ValueError as err:
            raise ValidationFailed(f"{path}:{ln}: {err}") from err
    return out


def load_openb_pods(path: Path = OPENB_PODS) -> list[Request]:
    """Pods as requests. ``gpu_milli`` is per GPU; multi-GPU pods take whole GPUs."""
    out = []
    for ln, r in _rows(path, {"cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}):
        try:
            k = int(r["num_gpu"])
            m = int(r["gpu_milli"]) if k else 0
            if k > 1:
                m = MILLI
            spec = (r.get("gpu_spec") or "").strip()
            types = frozenset(s for s in spec.split("|") if s)
            out.append(Request(int(r["cpu_milli"]), int(r["memory_mib"]), k, m, types))
        except ValueError as err:
            raise ValidationFailed(f"{path}:{ln}: {err}") from err
    return out


def openb_table(nodes: list[OpenbNode]) -> NodeTable:
    return NodeTable(
        [n.name for n in nodes],
        [n.model for n in nodes],
        [n.cpu_milli for n in nodes],
        [n.memory_mib for n in nodes],
        [n.gpu for n in nodes],
    )


def load_philly(path: Path = PHILLY, limit: int | None = None) -> list[PhillyJob]:
    """Philly jobs sorted by submission time (``limit``: the first N after sorting)."""
    raw = []
    for ln, r in _rows(path, {"timestamp", "duration", "num_gpus", "cluster"}):
        try:
            ts = datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp()
            raw.append((ts, float(r["duration"]), max(1, int(float(r["num_gpus"]))), r["cluster"]))
        except ValueError as err:
            raise ValidationFailed(f"{path}:{ln}: {err}") from err
    raw.sort()
    if limit is not None:
        raw = raw[:limit]
    t0 = raw[0][0] if raw else 0.0
    return [PhillyJob(ts - t0, d, g, c) for ts, d, g, c in raw]
