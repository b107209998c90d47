"""Running allocations indexed as preemption candidates, built once per pass (pure).

Preemption (:mod:`gpufleet.scheduler.preempt`) asks, for a pending job and a pool,
which running allocations it may take; scanning every running allocation for every
job that does not fit made a saturated pass cost pending × running. This index answers
in O(log n + k) for k answers instead.

Per on-prem pool it holds the allocations whose members all sit on usable nodes of the
pool (the only ones preemption can free), each exactly once:

- those already being preempted (``preempt_requested`` in the snapshot, or marked
  during the pass with :meth:`CandidateIndex.mark`): :meth:`CandidateIndex.freeing`,
  in the snapshot's running order;
- the others, unless preempted less than ``window_s`` before ``now`` (never a victim
  in this pass): lists sorted by (priority, position), one per team (``tenant/team``,
  the first two segments of the owner path) and one per ancestor path of the owner
  (``tenant``, ``tenant/team``, ``tenant/team/user``).

:meth:`CandidateIndex.eligible` returns the ``reclaim`` rule's candidates for a job —
the team's allocations of strictly lower priority, plus, when the job stays within its
guarantee, the allocations of at most its priority under every quota path that is
borrowing — ordered by the least work lost (time since the last checkpoint), then
priority, latest start, job id and position: the order the victims are tried in.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from gpufleet.scheduler.model import Allocation, ancestors

#: (priority, position in the snapshot's running list)
_Key = tuple[int, int]


def team_of(owner_path: str) -> str:
    """``tenant/team/user`` → ``tenant/team``."""
    return "/".join(owner_path.split("/")[:2])


class _Sorted:
    """Allocations sorted by (priority, position), with removal (see module docstring)."""

    __slots__ = ("keys", "items")

    def __init__(self, keys: list[_Key] | None = None) -> None:
        self.keys: list[_Key] = sorted(keys) if keys else []
        self.items: list[int] = [k[1] for k in self.keys]

    def remove(self, key: _Key) -> None:
        i = bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            del self.keys[i]
            del self.items[i]

    def below(self, priority: int, inclusive: bool) -> list[int]:
        """Positions of the allocations with priority < ``priority`` (``<=`` when ``inclusive``)."""
        end = bisect_left(self.keys, (priority + 1, -1) if inclusive else (priority, -1))
        return self.items[:end]


class _Pool:
    __slots__ = ("freeing", "by_team", "by_path")

    def __init__(self) -> None:
        self.freeing: list[int] = []
        self.by_team: dict[str, _Sorted] = defaultdict(_Sorted)
        self.by_path: dict[str, _Sorted] = defaultdict(_Sorted)


class CandidateIndex:
    """Preemption candidates of every on-prem pool (see module docstring)."""

    def __init__(
        self,
        running: list[Allocation],
        node_index: Mapping[str, Mapping[str, int]],
        preempting: set[str],
        quota_paths: Iterable[str],
        now: float,
        window_s: float,
    ) -> None:
        self.running = running
        quotas = set(quota_paths)
        order = sorted(
            range(len(running)),
            key=lambda i: (running[i].lost_work_s(now), running[i].priority, -running[i].started_at, running[i].job_id, i),
        )
        #: position → rank in the order victims are tried in
        self._rank = [0] * len(running)
        for r, i in enumerate(order):
            self._rank[i] = r
        self._pools: dict[str, _Pool] = defaultdict(_Pool)
        self._by_job: dict[str, list[int]] = defaultdict(list)
        self._quota_paths: dict[str, set[str]] = defaultdict(set)
        self._marked: set[int] = set()
        self._ancestors: dict[str, list[str]] = {}
        team_keys: dict[tuple[str, str], list[_Key]] = defaultdict(list)
        path_keys: dict[tuple[str, str], list[_Key]] = defaultdict(list)
        for i, a in enumerate(running):
            nodes = node_index.get(a.pool)
            if nodes is None or not all(m.node in nodes for m in a.members):
                continue
            pool = self._pools[a.pool]
            self._by_job[a.job_id].append(i)
            if a.job_id in preempting:
                pool.freeing.append(i)
                self._marked.add(i)
                continue
            paths = self._paths(a.owner_path)
            self._quota_paths[a.pool].update(p for p in paths if p in quotas)
            if a.last_preempted_at is not None and now - a.last_preempted_at < window_s:
                continue  # preempted within the window: never a victim in this pass
            key = (a.priority, i)
            team_keys[(a.pool, team_of(a.owner_path))].append(key)
            for p in paths:
                path_keys[(a.pool, p)].append(key)
        for (pool_name, team), keys in team_keys.items():
            self._pools[pool_name].by_team[team] = _Sorted(keys)
        for (pool_name, path), keys in path_keys.items():
            self._pools[pool_name].by_path[path] = _Sorted(keys)

    def _paths(self, owner_path: str) -> list[str]:
        got = self._ancestors.get(owner_path)
        if got is None:
            got = self._ancestors[owner_path] = ancestors(owner_path)
        return got

    def freeing(self, pool: str) -> list[Allocation]:
        """Allocations of ``pool`` already being preempted, in running order."""
        p = self._pools.get(pool)
        return [self.running[i] for i in p.freeing] if p else []

    def mark(self, job_id: str) -> None:
        """The job's allocations are being preempted: no longer candidates, counted as freeing."""
        for i in self._by_job.get(job_id, ()):
            if i in self._marked:
                continue
            self._marked.add(i)
            a = self.running[i]
            pool = self._pools[a.pool]
            insort(pool.freeing, i)
            key = (a.priority, i)
            pool.by_team[team_of(a.owner_path)].remove(key)
            for p in self._paths(a.owner_path):
                pool.by_path[p].remove(key)

    def eligible(self, pool: str, owner_path: str, priority: int, reclaim: bool, borrowing: Callable[[str], bool]) -> list[Allocation]:
        """Candidates of ``pool`` for a job of ``owner_path`` at ``priority``, in the order to try them.

        ``reclaim``: the job stays within its guarantee; ``borrowing(path)``: that quota
        path uses more than its guarantee (in the caller's working ledger)."""
        p = self._pools.get(pool)
        if p is None:
            return []
        found: set[int] = set()
        team = p.by_team.get(team_of(owner_path))
        if team is not None:
            found.update(team.below(priority, inclusive=False))
        if reclaim:
            for q in self._quota_paths.get(pool, ()):
                under = p.by_path.get(q)
                if under is not None and under.keys and borrowing(q):
                    found.update(under.below(priority, inclusive=True))
        return [self.running[i] for i in sorted(found, key=self._rank.__getitem__)]
