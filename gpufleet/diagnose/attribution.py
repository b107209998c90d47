"""GPU-time attribution: every GPU-second of a window, on every GPU of a set of nodes, given to exactly one cause (pure).

Contract:
- Inputs are frozen values (:class:`Inputs`): the window ``[start, end)`` (epoch seconds), the nodes
  (:class:`NodeInventory`: pool, GPU count, drained), the attempts that booked GPUs (:class:`Booking`: node,
  GPU indices, placed/released times and the attempt's phase marks of :mod:`gpufleet.phases`) and the
  intervals jobs spent PENDING (:class:`PendingInterval`: GPUs wanted, pools allowed, the scheduler's
  recorded reason). Times are taken to the millisecond; each GPU's causes then sum to exactly the window.
- A booked GPU's time goes to the phase its attempt was in (:data:`BOOKED_CAUSES`): ``placed`` →
  ``dispatched`` is :attr:`Cause.HELD_IDLE` (booked, nothing runs on it yet), up to ``started``
  :attr:`Cause.STARTING`, up to ``inputs_staged`` :attr:`Cause.STAGING`, up to ``model_loaded``
  :attr:`Cause.MODEL_LOAD`, up to ``generation_done`` :attr:`Cause.COMPUTING` (less any checkpoint
  stall: :attr:`Cause.CHECKPOINT`; the runtime records the stall's total, ``checkpoint_stall``, which
  :meth:`Booking.with_marks` places just before ``generation_done``, where the final drain is; and, when
  the runtime measured the GPUs' busy share ``gpu_busy``, only that share of each computing segment is
  computing, the rest :attr:`Cause.HELD_IDLE`: held but idle; unmeasured, all of it counts as
  computing), then :attr:`Cause.POST_PROCESSING` until the booking ends. A segment
  ends at the next mark present (a missing mark's phase is skipped). Booked time after the last mark
  without ``generation_done`` is :attr:`Cause.UNREPORTED` (the runtime reports its marks when generation
  ends: the attempt is still running or stopped first). Two bookings sharing a GPU (fractional jobs):
  the more productive phase wins (order of :data:`BOOKED_CAUSES`).
- A free GPU's time: on a drained node :attr:`Cause.DRAINED`; else, when no job was PENDING,
  :attr:`Cause.FREE_NO_WORK`; when the PENDING jobs all exclude its pool (``pools``), or the head job's
  reason names the GPU type, residency or burst policy, :attr:`Cause.FREE_AFFINITY`; else the head of
  the line (earliest PENDING of the jobs its pool may take) decides: a quota reason →
  :attr:`Cause.FREE_QUOTA`; waiting behind a starving job or for preempted capacity →
  :attr:`Cause.FREE_HEAD_OF_LINE`; otherwise by geometry at that moment: it fits on one node's free GPUs →
  :attr:`Cause.FREE_SCHED_LATENCY` (runnable, not yet placed), the pool has enough free GPUs but no node
  does → :attr:`Cause.FREE_FRAGMENTATION`, fewer free GPUs than it needs → :attr:`Cause.FREE_HEAD_OF_LINE`.
- :func:`attribute` returns an :class:`Attribution`: per-GPU lanes of segments and totals per cause, per
  pool and per node (:meth:`Attribution.by_node_ms`); :meth:`Attribution.table` ranks the lost causes (everything but computing and
  free-with-no-work) by GPU-seconds, each with its meaning and likely fix (:data:`FIXES`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    COMPUTING = "computing"
    MODEL_LOAD = "model_load"
    STAGING = "staging"
    CHECKPOINT = "checkpoint"
    POST_PROCESSING = "post_processing"
    STARTING = "starting"
    HELD_IDLE = "held_idle"
    UNREPORTED = "unreported"
    FREE_FRAGMENTATION = "free_fragmentation"
    FREE_QUOTA = "free_quota"
    FREE_AFFINITY = "free_affinity"
    FREE_SCHED_LATENCY = "free_sched_latency"
    FREE_HEAD_OF_LINE = "free_head_of_line"
    FREE_NO_WORK = "free_no_work"
    DRAINED = "drained"


#: causes of booked time, most productive first (the winner when bookings share a GPU)
BOOKED_CAUSES = (Cause.COMPUTING, Cause.CHECKPOINT, Cause.MODEL_LOAD, Cause.STAGING, Cause.POST_PROCESSING,
                 Cause.STARTING, Cause.HELD_IDLE, Cause.UNREPORTED)
#: causes that are not lost GPU time
NOT_LOST = frozenset({Cause.COMPUTING, Cause.FREE_NO_WORK})

#: cause -> (what it means, the likely fix)
FIXES: Mapping[Cause, tuple[str, str]] = {
    Cause.COMPUTING: ("the attempt was running denoising steps", "none: this is useful work"),
    Cause.MODEL_LOAD: ("booked, loading model weights (a cold cache fetches them)",
                       "keep models resident or cached on nodes (prefetch); schedule with model affinity"),
    Cause.STAGING: ("booked, staging the job's inputs", "stage inputs before placement or from a closer store; "
                    "schedule near the data"),
    Cause.CHECKPOINT: ("booked, the steps stalled writing a checkpoint", "checkpoint less often or asynchronously"),
    Cause.POST_PROCESSING: ("booked after generation until the GPUs were released: the outcome's report and "
                            "CompleteRun (which gives them back before finalize)",
                            "a long one: the node's report or the workflow before CompleteRun is slow (node API "
                            "latency, a Step Functions backlog)"),
    Cause.STARTING: ("booked, the process or container starting", "keep warm workers; pre-pull images"),
    Cause.HELD_IDLE: ("booked but the GPU idle: placed and not yet dispatched to the node, or the idle share of "
                      "the steps the runtime measured (NVML)",
                      "shorten the workflow between placement and dispatch; profile idle steps (host syncs, CPU "
                      "work, data loading in the loop)"),
    Cause.UNREPORTED: ("booked, the attempt reported no phase for this time (still running, or it stopped before "
                       "reporting)", "look again when it ends; check crashed attempts on the node"),
    Cause.FREE_FRAGMENTATION: ("free while a job waited: the pool had enough free GPUs but no node had them together",
                               "fragmentation-aware packing (packing=frag-aware); smaller shapes"),
    Cause.FREE_QUOTA: ("free while the head job waited on its quota", "raise the guarantee or allow borrowing"),
    Cause.FREE_AFFINITY: ("free while the waiting jobs could not use this pool (GPU type, residency, pools, burst "
                          "policy)", "widen the jobs' pools or move capacity to where the demand is"),
    Cause.FREE_SCHED_LATENCY: ("free while a job that fitted waited for a scheduler pass",
                               "check passes run on JobPending/CapacityFreed events; shorten the pass timer"),
    Cause.FREE_HEAD_OF_LINE: ("free while the head job needed more GPUs than were free (or waited on preemption)",
                              "backfill smaller jobs behind it; preempt for it sooner"),
    Cause.FREE_NO_WORK: ("free with nothing runnable in the queue", "none needed: right-size the pool"),
    Cause.DRAINED: ("free on a node an operator drained", "undrain or deregister the node"),
}

#: phase marks that end a booked segment, with the cause of the segment they end
_MARK_CAUSE = (("dispatched", Cause.HELD_IDLE), ("started", Cause.STARTING), ("inputs_staged", Cause.STAGING),
               ("model_loaded", Cause.MODEL_LOAD), ("first_step", Cause.COMPUTING),
               ("generation_done", Cause.COMPUTING))
_RANK = {c: i for i, c in enumerate(BOOKED_CAUSES)}


@dataclass(frozen=True)
class NodeInventory:
    node_id: str
    pool: str
    gpus: int
    drained: bool = False


@dataclass(frozen=True)
class Booking:
    """An attempt holding ``gpus`` (indices) of ``node_id`` from ``start`` (placed) to ``end`` (released;
    ``None``: still held). ``marks``: its :mod:`gpufleet.phases` marks as (name, epoch s) pairs;
    ``stalls``: checkpoint stalls (start, end); ``busy``: the GPUs' measured busy share while computing
    (``None``: not measured)."""

    job_id: str
    epoch: int
    node_id: str
    gpus: tuple[int, ...]
    start: float
    end: float | None
    marks: tuple[tuple[str, float], ...] = ()
    stalls: tuple[tuple[float, float], ...] = ()
    busy: float | None = None

    @staticmethod
    def with_marks(marks: Mapping[str, Any], **kw: Any) -> Booking:
        """A booking whose ``marks`` are the numeric phase marks of ``marks``; its ``checkpoint_stall`` seconds
        become one stall ending at ``generation_done`` (not before ``first_step``), its ``gpu_busy`` the
        ``busy`` share; other details are ignored."""
        names = {m for m, _ in _MARK_CAUSE}
        num = {k: float(v) for k, v in marks.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        stalls = kw.pop("stalls", ())
        stall, done = num.get("checkpoint_stall", 0.0), num.get("generation_done")
        if stall > 0 and done is not None:
            stalls = (*stalls, (max(done - stall, num.get("first_step", done - stall)), done))
        busy = num.get("gpu_busy", kw.pop("busy", None))
        return Booking(marks=tuple(sorted((k, v) for k, v in num.items() if k in names)), stalls=stalls,
                       busy=min(1.0, max(0.0, busy)) if busy is not None else None, **kw)


@dataclass(frozen=True)
class PendingInterval:
    """A job PENDING over ``[start, end)`` (``end`` ``None``: still), wanting ``gpus`` per node on ``nodes``
    node(s); ``pools``: the pools it may use (empty: any); ``reason``: the scheduler's recorded reason."""

    job_id: str
    start: float
    end: float | None
    gpus: int
    pools: tuple[str, ...] = ()
    reason: str = ""
    nodes: int = 1


@dataclass(frozen=True)
class Inputs:
    start: float
    end: float
    nodes: tuple[NodeInventory, ...]
    bookings: tuple[Booking, ...] = ()
    pending: tuple[PendingInterval, ...] = ()


@dataclass(frozen=True)
class Segment:
    start_ms: int
    end_ms: int
    cause: Cause
    job_id: str | None = None

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000


@dataclass(frozen=True)
class Lane:
    node_id: str
    pool: str
    gpu: int
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Row:
    cause: Cause
    gpu_seconds: float
    share: float
    lost: bool
    meaning: str
    fix: str


@dataclass(frozen=True)
class Attribution:
    start: float
    end: float
    lanes: tuple[Lane, ...]
    #: cause -> GPU-milliseconds (every cause, zeros included)
    totals_ms: Mapping[Cause, int] = field(default_factory=dict)
    by_pool_ms: Mapping[str, Mapping[Cause, int]] = field(default_factory=dict)

    def by_node_ms(self) -> dict[str, dict[Cause, int]]:
        """node -> cause -> GPU-milliseconds (from the lanes)."""
        out: dict[str, dict[Cause, int]] = {}
        for ln in self.lanes:
            node = out.setdefault(ln.node_id, {})
            for s in ln.segments:
                node[s.cause] = node.get(s.cause, 0) + s.end_ms - s.start_ms
        return out

    @property
    def gpu_seconds(self) -> float:
        return sum(self.totals_ms.values()) / 1000

    @property
    def utilisation(self) -> float:
        total = sum(self.totals_ms.values())
        return self.totals_ms.get(Cause.COMPUTING, 0) / total if total else 0.0

    def table(self) -> list[Row]:
        """Every cause with GPU time: the lost ones ranked by GPU-seconds (largest first), then the others."""
        total = sum(self.totals_ms.values()) or 1
        rows = [Row(c, ms / 1000, ms / total, c not in NOT_LOST, *FIXES[c]) for c, ms in self.totals_ms.items() if ms]
        return sorted(rows, key=lambda r: (not r.lost, -r.gpu_seconds, r.cause.value))

    def as_dict(self, *, lanes: bool = False) -> dict[str, Any]:
        """JSON-ready: window, GPUs, utilisation, the ranked table, per-pool seconds (and the lanes)."""
        out: dict[str, Any] = {
            "start": self.start, "end": self.end, "gpus": len(self.lanes),
            "gpu_seconds": round(self.gpu_seconds, 3), "utilisation": round(self.utilisation, 4),
            "causes": [{"cause": r.cause.value, "gpu_seconds": round(r.gpu_seconds, 3), "share": round(r.share, 4),
                        "lost": r.lost, "meaning": r.meaning, "fix": r.fix} for r in self.table()],
            "pools": {p: {c.value: ms / 1000 for c, ms in causes.items() if ms} for p, causes in self.by_pool_ms.items()},
            "nodes": {n: {c.value: ms / 1000 for c, ms in causes.items() if ms} for n, causes in self.by_node_ms().items()},
        }
        if lanes:
            out["lanes"] = [{"node": ln.node_id, "pool": ln.pool, "gpu": ln.gpu,
                             "segments": [[s.start_ms / 1000, s.end_ms / 1000, s.cause.value, s.job_id]
                                          for s in ln.segments]} for ln in self.lanes]
        return out


def from_dict(doc: Mapping[str, Any]) -> Attribution:
    """The :class:`Attribution` of :meth:`Attribution.as_dict` ``(lanes=True)`` (e.g. an API response): totals
    are recomputed from the lanes."""
    lanes, totals = [], {c: 0 for c in Cause}
    by_pool: dict[str, dict[Cause, int]] = {}
    for ln in doc.get("lanes") or []:
        segs = tuple(Segment(_ms(a), _ms(z), Cause(c), j) for a, z, c, j in ln["segments"])
        lanes.append(Lane(str(ln["node"]), str(ln["pool"]), int(ln["gpu"]), segs))
        pool = by_pool.setdefault(str(ln["pool"]), {c: 0 for c in Cause})
        for s in segs:
            totals[s.cause] += s.end_ms - s.start_ms
            pool[s.cause] += s.end_ms - s.start_ms
    return Attribution(float(doc["start"]), float(doc["end"]), tuple(lanes), totals, by_pool)


def _ms(t: float) -> int:
    return int(round(t * 1000))


def booking_segments(b: Booking, end: float) -> list[tuple[int, int, Cause]]:
    """The booked segments of ``b`` (ms; ``end``: the release time used when ``b.end`` is None)."""
    lo, hi = _ms(b.start), _ms(b.end if b.end is not None else end)
    if hi <= lo:
        return []
    marks = dict(b.marks)
    out: list[tuple[int, int, Cause]] = []
    cur = lo
    for name, cause in _MARK_CAUSE:
        if name in marks:
            t = min(max(_ms(marks[name]), cur), hi)
            if t > cur:
                out.append((cur, t, cause))
            cur = t
    if cur < hi:
        out.append((cur, hi, Cause.POST_PROCESSING if "generation_done" in marks else Cause.UNREPORTED))
    for s_lo, s_hi in b.stalls:  # a checkpoint stall takes the computing time it overlaps
        a, z = _ms(s_lo), _ms(s_hi)
        split: list[tuple[int, int, Cause]] = []
        for x, y, c in out:
            if c is not Cause.COMPUTING or z <= x or a >= y:
                split.append((x, y, c))
                continue
            for p, q, cc in ((x, max(x, a), c), (max(x, a), min(y, z), Cause.CHECKPOINT), (min(y, z), y, c)):
                if q > p:
                    split.append((p, q, cc))
        out = split
    if b.busy is not None and b.busy < 1:  # the measured busy share of each computing segment, the rest idle
        shared: list[tuple[int, int, Cause]] = []
        for x, y, c in out:
            cut = x + int(round((y - x) * b.busy)) if c is Cause.COMPUTING else y
            shared.extend(seg for seg in ((x, cut, c), (cut, y, Cause.HELD_IDLE)) if seg[1] > seg[0])
        out = shared
    return out


_QUOTA_WORDS = ("quota", "guarantee")
_AFFINITY_WORDS = ("residency", "job wants", "before bursting", "of the job's pools", "exists")
_HEAD_WORDS = ("starving", "preempt")


def _free_cause(pending: list[PendingInterval], pool: str, pool_free: int, node_free_max: int) -> Cause:
    if not pending:
        return Cause.FREE_NO_WORK
    eligible = [p for p in pending if not p.pools or pool in p.pools]
    if not eligible:
        return Cause.FREE_AFFINITY
    head = min(eligible, key=lambda p: (p.start, p.job_id))
    reason = head.reason.lower()
    if any(w in reason for w in _QUOTA_WORDS):
        return Cause.FREE_QUOTA
    if any(w in reason for w in _AFFINITY_WORDS):
        return Cause.FREE_AFFINITY
    if any(w in reason for w in _HEAD_WORDS):
        return Cause.FREE_HEAD_OF_LINE
    if pool_free < head.gpus * head.nodes:
        return Cause.FREE_HEAD_OF_LINE
    if head.nodes == 1 and node_free_max < head.gpus:
        return Cause.FREE_FRAGMENTATION
    return Cause.FREE_SCHED_LATENCY


def attribute(inp: Inputs) -> Attribution:
    """Attribute every GPU-millisecond of ``inp``'s window on every GPU of ``inp.nodes`` (module contract)."""
    w0, w1 = _ms(inp.start), _ms(inp.end)
    if w1 <= w0:
        raise ValueError("the window must end after it starts")
    nodes = {n.node_id: n for n in inp.nodes}
    lanes_keys = [(n.node_id, g) for n in inp.nodes for g in range(max(0, n.gpus))]
    segs: dict[tuple[str, int], list[tuple[int, int, Cause, str]]] = defaultdict(list)
    points = {w0, w1}
    for b in inp.bookings:
        if b.node_id not in nodes:
            continue
        for lo, hi, cause in booking_segments(b, inp.end):
            lo, hi = max(lo, w0), min(hi, w1)
            if hi <= lo:
                continue
            points.update((lo, hi))
            for g in b.gpus:
                if 0 <= g < nodes[b.node_id].gpus:
                    segs[(b.node_id, g)].append((lo, hi, cause, b.job_id))
    pend = []
    for p in inp.pending:
        lo, hi = max(_ms(p.start), w0), min(_ms(p.end) if p.end is not None else w1, w1)
        if hi > lo:
            points.update((lo, hi))
            pend.append((lo, hi, p))
    cuts = sorted(points)
    k = len(cuts) - 1
    # paint each lane's booked intervals (the most productive cause wins a shared GPU)
    painted: dict[tuple[str, int], list[tuple[Cause, str] | None]] = {key: [None] * k for key in lanes_keys}
    for key, items in segs.items():
        row = painted[key]
        for lo, hi, cause, job in items:
            for i in range(bisect.bisect_left(cuts, lo), bisect.bisect_left(cuts, hi)):
                if row[i] is None or _RANK[cause] < _RANK[row[i][0]]:
                    row[i] = (cause, job)
    by_pool_nodes: dict[str, list[NodeInventory]] = defaultdict(list)
    for n in inp.nodes:
        by_pool_nodes[n.pool].append(n)
    # free causes per pool and interval
    for i in range(k):
        a, z = cuts[i], cuts[i + 1]
        waiting = [p for lo, hi, p in pend if lo <= a and hi >= z]
        for pool, members in by_pool_nodes.items():
            free_by_node = {n.node_id: sum(1 for g in range(n.gpus) if painted[(n.node_id, g)][i] is None)
                            for n in members if not n.drained}
            cause = _free_cause(waiting, pool, sum(free_by_node.values()), max(free_by_node.values(), default=0))
            for n in members:
                for g in range(n.gpus):
                    if painted[(n.node_id, g)][i] is None:
                        painted[(n.node_id, g)][i] = (Cause.DRAINED if n.drained else cause, None)
    totals = {c: 0 for c in Cause}
    by_pool: dict[str, dict[Cause, int]] = {p: {c: 0 for c in Cause} for p in by_pool_nodes}
    lanes = []
    for node_id, g in lanes_keys:
        row = painted[(node_id, g)]
        merged: list[Segment] = []
        for i, (cause, job) in enumerate(row):  # type: ignore[misc] - every interval is painted by now
            a, z = cuts[i], cuts[i + 1]
            if merged and merged[-1].cause is cause and merged[-1].job_id == job and merged[-1].end_ms == a:
                merged[-1] = Segment(merged[-1].start_ms, z, cause, job)
            else:
                merged.append(Segment(a, z, cause, job))
            totals[cause] += z - a
            by_pool[nodes[node_id].pool][cause] += z - a
        lanes.append(Lane(node_id, nodes[node_id].pool, g, tuple(merged)))
    return Attribution(inp.start, inp.end, tuple(lanes), totals, by_pool)
