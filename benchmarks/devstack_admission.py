"""Admission throughput of the embedded stack (``gpufleet dev``) through its signed front door, and its Ctrl-C.

Starts ``gpufleet dev --no-agent`` as a subprocess (its own state directory, free ports), onboards ``--users``
local principals (``gpufleet dev --add-principal`` plus their tenant/team/user mapping, as an operator does; one
user alone would reach the API's soft quota of 100 queued jobs), then submits jobs through the SDK (SigV4, the
local gateway) open loop: submission ``i`` is sent at ``t0 + i / rate`` whatever the earlier ones are doing,
for ``--duration`` seconds. Every job asks for pool ``onprem-a`` and no agent serves it, so the job stops at
PENDING (the scheduler writes a wait reason): only admission runs (API, outbox stream consumer, workflow
start, CheckPrompt, the pending transition, the scheduler passes it wakes).

Measured: requests accepted (202) / refused / failed; request latency p50/p99; jobs lost (accepted, never in
the jobs table) and duplicated (one submission index on two job items); time from ``created`` to ``PENDING``
(from each job's own timeline) p50/p99 and how many reached PENDING within ``--pending-timeout``; the stack
process's CPU seconds per job over the load (its CPU time over wall time shows how much of a core it got on a
shared machine); from the stack's log, the scheduler passes that ran and the backoffs they wrote (one job-item
``UpdateItem`` each: the parked jobs' UNRESOLVABLE retries) per job. Then it sends SIGINT with every parked execution still RUNNING and times the exit
(``--stop-timeout``, then SIGKILL).

``--before PATH`` first runs the same measurement against the source tree at PATH (a worktree of the previous
commit: ``git worktree add /tmp/before main``), then against this tree, and prints the ratios.

    python benchmarks/devstack_admission.py [--rate 5] [--duration 60] [--users 8] [--before PATH]

Prints a table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TENANT, TEAM = "dev", "local"  # the stack's own developer tenant and team (DevSettings defaults)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, its live descendants (the API process) and its reaped children
    so far (0 once it is gone)."""
    import psutil

    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return 0.0
    for child in p.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def _alive(pid: int | None) -> bool:
    import psutil

    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_stack(src: Path, state: Path, timeout: float) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.cli.main",
        "dev",
        "--state-dir",
        str(state),
        "--port",
        "0",
        "--console-port",
        "0",
        "--no-agent",
    ]
    log = open(state.parent / f"{state.name}.out", "w")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
    manifest = state / "stack.json"
    deadline = time.monotonic() + timeout
    while not manifest.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the stack did not start (see {log.name})")
        time.sleep(0.5)
    time.sleep(0.2)
    return proc, json.loads(manifest.read_text())


def stack_client(manifest: dict, service: str):
    """A boto3 client of ``service`` on the running stack (its ``stack.json`` aws block)."""
    import boto3

    aws = manifest["aws"]
    return boto3.client(service, region_name=aws["region"], endpoint_url=aws["endpoint_url"],
                        aws_access_key_id=aws["access_key_id"], aws_secret_access_key=aws["secret_access_key"])


def onboard(state: Path, manifest: dict, users: int) -> list:
    """``users`` principals, each mapped to dev/local/bench<i>; returns an SDK client per user."""

    from gpufleet.devstack.principals import add_principal
    from gpufleet.profile import load_profile
    from gpufleet.sdk import Client
    from gpufleet.store.principals import put_principal

    ddb = stack_client(manifest, "dynamodb")
    clients = []
    for i in range(users):
        arn, profile = add_principal(state, f"bench{i}")
        put_principal(ddb, manifest["aws"]["tables"]["control"], arn, TENANT, TEAM, f"bench{i}")
        clients.append(Client(profile=load_profile(profile)))
    return clients


def load(clients: list, rate: float, duration: float) -> list[dict]:
    """Open-loop submissions: request i is sent at t0 + i/rate; returns one record per request."""
    n = int(rate * duration)
    out: list[dict] = [{} for _ in range(n)]
    t0 = time.monotonic() + 0.5

    def one(i: int) -> None:
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        spec = {
            "workload": {
                "kind": "video.generate",
                "prompt": f"a red fox running in snow, take {i}",
                "frames": 9,
                "steps": 10,
            },
            "pools": ["onprem-a"],
            "labels": {"bench-index": str(i)},
        }
        sent = time.monotonic()
        rec: dict = {"i": i, "late_s": sent - (t0 + i / rate)}
        try:
            job = clients[i % len(clients)].submit(spec)
            rec.update(ok=True, job_id=job.job_id)
        except Exception as err:  # noqa: BLE001 - counted and reported
            rec.update(ok=False, error=f"{type(err).__name__}: {err}"[:200])
        rec["latency_s"] = time.monotonic() - sent
        out[i] = rec

    # enough threads that a slow answer never delays a later send (open loop)
    with ThreadPoolExecutor(max_workers=min(n, 256)) as pool:
        list(pool.map(one, range(n)))
    return out


def scan_jobs(manifest: dict) -> dict[str, dict]:
    """job id -> {status, index, created, pending} from the jobs table (META and EVENT items)."""

    from gpufleet.store.dynamo import unmarshal

    ddb = stack_client(manifest, "dynamodb")
    jobs: dict[str, dict] = {}
    # only what is read below (the stack serves this poll, and its CPU counts as the stack's)
    names = {"#pk": "pk", "#sk": "sk", "#st": "status", "#sp": "spec", "#lb": "labels", "#dt": "detail", "#to": "to",
             "#ts": "ts", "#ty": "type", "#kd": "kind"}
    pages = ddb.get_paginator("scan").paginate(TableName=manifest["aws"]["tables"]["jobs"],
                                               ProjectionExpression="#pk, #sk, #st, #sp.#lb, #lb, #dt.#to, #ts, #ty, #kd",
                                               ExpressionAttributeNames=names)
    for page in pages:
        for raw in page["Items"]:
            item = unmarshal(raw)
            pk, sk = str(item.get("pk", "")), str(item.get("sk", ""))
            if not pk.startswith("JOB#"):
                continue
            rec = jobs.setdefault(pk[4:], {})
            if sk == "META":
                rec["status"] = item.get("status")
                spec = item.get("spec") or {}
                labels = (spec.get("labels") if isinstance(spec, dict) else None) or item.get("labels") or {}
                rec["index"] = labels.get("bench-index")
            elif sk.startswith("EVENT#"):
                detail = item.get("detail") if isinstance(item.get("detail"), dict) else {}
                ts = item.get("ts") or sk.split("#")[1]
                if item.get("type") == "created" or item.get("kind") == "created":
                    rec["created"] = _ts(ts)
                elif detail.get("to") == "PENDING" and "pending" not in rec:
                    rec["pending"] = _ts(ts)
    return jobs


def pass_totals(state: Path) -> dict:
    """The scheduler passes the stack logged (``"event": "scheduler_pass"`` lines of its log, the whole run): how
    many ran, and the backoffs they recorded (one job-item UpdateItem each) and the parked jobs woken early by a
    change of the cluster's shape."""
    passes = backoffs = woken = 0
    log = state / "logs" / "stack.log"
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else ():
        if '"scheduler_pass"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "scheduler_pass" and not rec.get("skipped"):
            passes += 1
            backoffs += int(rec.get("backoffs") or 0)
            woken += int(rec.get("woken") or 0)
    return {"passes": passes, "backoffs": backoffs, "woken": woken}


def running_executions(manifest: dict) -> int:

    sfn = stack_client(manifest, "stepfunctions")
    n = 0
    for page in sfn.get_paginator("list_executions").paginate(
        stateMachineArn=manifest["state_machine_arn"], statusFilter="RUNNING"
    ):
        n += len(page["executions"])
    return n


def measure(src: Path, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="gpufleet-admission-"))
    state = work / "state"
    state.mkdir()
    t_start = time.monotonic()
    proc, manifest = start_stack(src, state, args.start_timeout)
    start_s = time.monotonic() - t_start
    try:
        clients = onboard(state, manifest, args.users)
        time.sleep(2.0)  # let the start-up scheduler passes settle
        api_pids = (manifest.get("api") or {}).get("pids") or []  # the API processes (absent before there were any)
        cpu0, wall0 = _cpu_s(proc.pid), time.monotonic()
        api_cpu0 = sum(_cpu_s(p) for p in api_pids)
        load1 = os.getloadavg()[0]
        spy = None
        if args.profile:  # py-spy on the stack process over the load and the settling after it
            spy = subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "-p",
                    str(proc.pid),
                    "-o",
                    args.profile,
                    "-f",
                    args.profile_format,
                    "-r",
                    "50",
                    "--nonblocking",
                    "--gil",
                    "-d",
                    str(int(args.duration + args.profile_tail_s)),
                    *(["--subprocesses"] if args.profile_subprocesses else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        records = load(clients, args.rate, args.duration)
        load_wall = time.monotonic() - wall0
        accepted = [r for r in records if r.get("ok")]
        ids = {r["job_id"] for r in accepted}
        # wait until every accepted job is PENDING (or the timeout)
        deadline = time.monotonic() + args.pending_timeout
        while True:
            jobs = scan_jobs(manifest)
            waiting = [j for j in ids if jobs.get(j, {}).get("pending") is None]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(args.poll_s)  # each poll scans the whole jobs table in the stack process (its CPU is counted)
        settle_wall = time.monotonic() - wall0
        if spy is not None:
            spy.wait()
        cpu_s = _cpu_s(proc.pid) - cpu0
        api_cpu_s = (sum(_cpu_s(p) for p in api_pids) - api_cpu0) if api_pids else None
        load2 = os.getloadavg()[0]
        by_index: dict[str, int] = {}
        for j in jobs.values():
            if j.get("index") is not None:
                by_index[j["index"]] = by_index.get(j["index"], 0) + 1
        lost = sorted(ids - set(jobs))
        duplicated = sum(c - 1 for c in by_index.values() if c > 1)
        to_pending = [
            jobs[j]["pending"] - jobs[j]["created"]
            for j in ids
            if jobs.get(j, {}).get("pending") is not None and jobs[j].get("created") is not None
        ]
        latencies = [r["latency_s"] for r in records]
        inflight = running_executions(manifest)
        # Ctrl-C with every parked execution in flight
        t_sig = time.monotonic()
        sigint_at = time.time()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=args.stop_timeout)
            stop_s = time.monotonic() - t_sig
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            stop_s = float("inf")
        time.sleep(0.5)
        orphan = any(_alive(p) for p in api_pids)  # the API processes must end with the stack
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sched = pass_totals(state)
    errors: dict[str, int] = {}
    for r in records:
        if not r.get("ok"):
            key = r["error"].split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "src": str(src),
        "stack_start_s": round(start_s, 1),
        "sent": len(records),
        "accepted": len(accepted),
        "refused_or_failed": len(records) - len(accepted),
        "errors": errors,
        "offered_per_s": args.rate,
        "accepted_per_s": round(len(accepted) / load_wall, 2),
        "request_p50_s": round(pct(latencies, 50), 3),
        "request_p99_s": round(pct(latencies, 99), 3),
        # where in the run the slow answers fall: each 10 s window of sends, its slowest request
        "request_max_by_10s": [
            round(max((r["latency_s"] for r in records if w <= r["i"] / args.rate < w + 10), default=0.0), 2)
            for w in range(0, int(args.duration), 10)
        ],
        "send_late_p99_s": round(pct([r["late_s"] for r in records], 99), 3),
        "lost": len(lost),
        "duplicated": duplicated,
        "reached_pending": len(to_pending),
        "to_pending_p50_s": round(pct(to_pending, 50), 2),
        "to_pending_p99_s": round(pct(to_pending, 99), 2),
        "load_and_settle_s": round(settle_wall, 1),
        "stack_cpu_s": round(cpu_s, 1),
        "stack_cpu_s_per_job": round(cpu_s / max(1, len(accepted)), 3),
        "stack_cpu_share": round(cpu_s / settle_wall, 2),
        "scheduler_passes": sched["passes"],
        "backoff_writes": sched["backoffs"],
        "backoff_writes_per_job": round(sched["backoffs"] / max(1, len(accepted)), 2),
        "woken_by_shape": sched["woken"],
        "api_process_cpu_s": round(api_cpu_s, 1) if api_cpu_s is not None else None,
        "api_process_left_running": orphan,
        "inflight_at_sigint": inflight,
        "stop_s": round(stop_s, 1),
        "sigint_at": datetime.fromtimestamp(sigint_at).isoformat(timespec="milliseconds"),
        "exit_code": code,
        "loadavg_1m": [round(load1, 2), round(load2, 2)],
        "state": str(work),
    }


def show(label: str, r: dict) -> None:
    print(f"[{label}] {r['src']}")
    for k, v in r.items():
        if k != "src":
            print(f"  {k:24} {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=5.0, help="submissions per second (open loop)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    ap.add_argument("--users", type=int, default=8, help="principals the submissions are spread over")
    ap.add_argument("--pending-timeout", type=float, default=300.0, help="how long to wait for PENDING after the load")
    ap.add_argument("--stop-timeout", type=float, default=180.0, help="SIGKILL after this many seconds of SIGINT")
    ap.add_argument("--poll-s", type=float, default=5.0,
                    help="seconds between scans of the jobs table while waiting for PENDING (the stack serves them)")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--before", type=Path, default=None, help="source tree of the previous version, measured first")
    ap.add_argument("--profile", default=None, help="write a py-spy profile of the stack process over the load here")
    ap.add_argument("--profile-format", default="raw", help="py-spy output format (raw: collapsed stacks)")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    ap.add_argument("--profile-tail-s", type=float, default=30.0, help="how long py-spy records after the load")
    ap.add_argument("--profile-subprocesses", action="store_true",
                    help="also record the stack's subprocesses (API processes, Lambda workers: the scheduler pass)")
    args = ap.parse_args(argv)

    results: dict[str, dict] = {}
    if args.before is not None:
        results["before"] = measure(args.before.resolve(), args)
        show("before", results["before"])
    results["after"] = measure(ROOT, args)
    show("after", results["after"])
    summary: dict = {
        "rate": args.rate,
        "duration_s": args.duration,
        "users": args.users,
        **{f"{k}": {x: v for x, v in r.items() if x not in ("src", "state")} for k, r in results.items()},
    }
    if "before" in results:
        b, a = results["before"], results["after"]
        summary["ratios_after_over_before"] = {
            k: round(a[k] / b[k], 3) if b[k] else None
            for k in ("request_p50_s", "request_p99_s", "to_pending_p50_s", "stack_cpu_s_per_job", "stop_s")
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
