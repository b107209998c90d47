"""Benchmark: what the test suite costs on this machine, where, and against an earlier run.

Runs the suite as ``make test`` does (``pytest -n 2 --dist loadgroup``, bytecode written) with
:mod:`suite_cpu_plugin`, then prints the wall time, the CPU seconds (the workers, and every process they
reaped: the e2e stack's whole life lands on its last test, a session-scoped server's on the test that ended
its worker's session), the tests' CPU by file, and each worker's busy span. ``--compare OLD.jsonl`` prints
the files whose CPU moved most against an earlier run's record. ``--summarise FILE`` summarises a record
without running anything.

The budget is 10 minutes of wall on 2 cores (``make test`` on a fresh clone also installs first); the wall is
close to the busier worker's span, and the CPU divided by the cores is its floor.

Usage:
  .venv/bin/python benchmarks/suite_cost.py [--out FILE] [--compare OLD] [-- extra pytest args]
  .venv/bin/python benchmarks/suite_cost.py --summarise FILE [--compare OLD]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["id"] != "SESSION_END"], [r for r in rows if r["id"] == "SESSION_END"]


def by_file(tests: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in tests:
        f = out[r["id"].split("::")[0]]
        f[0] += r["self"]
        f[1] += r["children"]
        f[2] += r["end"] - r["start"]
    return out


def summarise(path: Path, compare: Path | None, top: int) -> dict:
    tests, ends = load(path)
    files = by_file(tests)
    t0 = min(r["start"] for r in tests)
    cpu_self = sum(v[0] for v in files.values())
    cpu_children = sum(v[1] for v in files.values())
    print(f"{len(tests)} tests; CPU in tests: {cpu_self:.0f} s in the workers + {cpu_children:.0f} s in processes they reaped")
    for e in sorted(ends, key=lambda e: str(e["w"])):
        mine = [r for r in tests if r["w"] == e["w"]]
        if mine:
            print(f"  worker {e['w']}: busy {min(r['start'] for r in mine) - t0:.0f}-{max(r['end'] for r in mine) - t0:.0f} s, "
                  f"session CPU {e['self']:.0f} s + reaped {e['children']:.0f} s, gc {e.get('gc', e.get('gc_total', 0)):.0f} s")
    print(f"top {top} files by CPU (workers + reaped, wall):")
    for name, (s, c, w) in sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
        print(f"  {s + c:7.1f} = {s:6.1f} + {c:6.1f}  wall {w:6.1f}  {name}")
    if compare is not None:
        old = by_file(load(compare)[0])
        moved = sorted(set(old) | set(files), key=lambda f: -abs(sum(files[f][:2]) - sum(old[f][:2])))
        print(f"moved most against {compare}:")
        for name in moved[:top]:
            print(f"  {sum(files[name][:2]) - sum(old[name][:2]):+7.1f}  {sum(old[name][:2]):7.1f} -> "
                  f"{sum(files[name][:2]):7.1f}  {name}")
    return {"tests": len(tests), "cpu_tests_s": round(cpu_self + cpu_children, 1),
            "span_s": round(max(r["end"] for r in tests) - t0, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "build" / "suite_cpu.jsonl")
    p.add_argument("--compare", type=Path)
    p.add_argument("--summarise", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("pytest_args", nargs="*")
    a = p.parse_args()
    if a.summarise:
        head = summarise(a.summarise, a.compare, a.top)
        print(json.dumps(head))
        return 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["SUITE_CPU_OUT"] = str(a.out)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "suite_cpu_plugin",
            *a.pytest_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    code = subprocess.call(argv, cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(f"pytest exit {code}; wall {wall:.0f} s; CPU {cpu:.0f} s (all processes reaped), "
          f"{cpu / wall:.2f} cores on average; load average now {os.getloadavg()[0]:.2f}")
    head = summarise(a.out, a.compare, a.top)
    print(json.dumps({"exit": code, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **head,
                      "record": str(a.out)}))
    return code


if __name__ == "__main__":
    sys.exit(main())
