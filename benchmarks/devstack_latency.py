"""End-to-end latency of text-to-video jobs through the embedded local stack, by phase.

Starts the stack (``gpufleet.devstack``), submits ``--jobs`` jobs one after another through the
SDK, and reads each job's timeline to split its latency into phases:

- admission: created → PENDING (outbox, workflow start, tier-1 prompt check);
- placement: PENDING → RUNNING (scheduler pass, SQS delivery, agent start of the runtime);
- run: the GPU-seconds the worker reported for the generation (on the FINALIZING transition);
- finalize: FINALIZING → SUCCEEDED (moderation, watermark, MP4, C2PA, publish);
- denoise: the first denoising step and the steps after it, from the attempt's phase timings
  (``detail.phases`` of the FINALIZING event, :mod:`gpufleet.phases`);
- total: created → SUCCEEDED, and the ratios total / run and total / denoise (issue 19's demo figure).

The first job pays cold starts (prompt model, torch import, model build); later ones show the warm
path. Prints a table, then one JSON object on the last line.

``--burst N`` then submits N more jobs at once (a queue for the node's one GPU: ``--burst-pool``, ``onprem-a`` by
default, pins them to the node's pool) and reports how busy the queue kept
the GPU: for each job ordered by its run, the idle gap between the previous job's run ending (its FINALIZING event)
and this one's run starting (RUNNING), the share of the burst's span the runs covered, and on which pools the jobs
ran (a job sent to the cloud pool because its node still looked busy starts a cold worker there).

The client waits for each job by polling its status every ``--poll-s`` (0.5 s, as ``gpufleet demo`` does; each
poll is an API request, which the dev stack serves before background work, so a faster poll slows the job it
watches). ``--timeline`` adds each job's events (seconds from its creation) and, on FINALIZING, the attempt's
phase durations (dispatch, start, first_step, steps, ...).

``--model-folder PATH`` runs the jobs on another model than the built-in wan-tiny: a diffusers Wan folder, published
to the stack's models root and registered in its model catalog as an operator would (``gpufleet admin models
publish``), then named by every job (``--model-name``, default the folder's name). This is the check of issue 19's
demo figure with a real model's denoising (on a machine with a GPU: the stack runs its jobs on CUDA when it has one).

    python benchmarks/devstack_latency.py [--jobs 3] [--steps 10 | --steps 10,50] [--frames 9] [--poll-s 0.5] [--timeline] [--burst 6]
    python benchmarks/devstack_latency.py --jobs 4 --timeline --model-folder /models/Wan2.1-T2V-1.3B-Diffusers --width 480 --height 480
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def phases(events: list, billing: dict | None) -> dict[str, float]:
    """Phase durations (seconds) from a SUCCEEDED job's timeline (pure)."""
    created = pending = running = finalizing = done = run_reported = None
    recorded: dict = {}
    for e in events:
        d = e.detail if isinstance(e.detail, dict) else {}
        to = d.get("to")
        t = _ts(e.ts)
        if e.type == "created":
            created = t
        elif to == "PENDING" and pending is None:
            pending = t
        elif to == "RUNNING":
            running = t
        elif to == "FINALIZING":
            finalizing = t
            run_reported = d.get("gpu_seconds")
            recorded = (d.get("phases") or {}).get("durations") or {}
        elif to == "SUCCEEDED":
            done = t
    if None in (created, pending, finalizing, done):
        raise ValueError("timeline is missing a phase")
    run = float(run_reported if run_reported is not None else (billing or {}).get("gpu_seconds") or 0.0)
    denoise = float(recorded.get("first_step", 0.0)) + float(recorded.get("steps", 0.0))
    started = running if running is not None else finalizing
    return {
        "admission_s": pending - created,
        "placement_and_run_s": finalizing - pending,
        "placement_s": max(0.0, (started - pending) - run) if running is not None else float("nan"),
        "run_s": run,
        "finalize_s": done - finalizing,
        "total_s": done - created,
        "overhead_ratio": (done - created) / run if run else float("nan"),
        # the denoising itself, from the attempt's phase timings: the first step (prompt encoding and the
        # first step's warm-up included) and the steps after it
        "denoise_s": denoise,
        "total_over_denoise": (done - created) / denoise if denoise else float("nan"),
    }


def run_window(events: list) -> tuple[float, float]:
    """A SUCCEEDED job's run: its last RUNNING event to its FINALIZING event (epoch seconds; pure)."""
    running = finalizing = None
    for e in events:
        to = (e.detail if isinstance(e.detail, dict) else {}).get("to")
        if to == "RUNNING":
            running = _ts(e.ts)
        elif to == "FINALIZING":
            finalizing = _ts(e.ts)
    if running is None or finalizing is None:
        raise ValueError("timeline has no run")
    return running, finalizing


def burst_figures(windows: list[tuple[float, float]]) -> dict[str, float]:
    """Idle gaps between consecutive runs (ordered by start; a negative gap is an overlap, counted as 0) and the share
    of the span from the first run's start to the last run's end that some run covered (pure)."""
    ws = sorted(windows)
    gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(ws)]
    covered, end = 0.0, float("-inf")
    for start, stop in ws:
        covered += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = ws[-1][1] - ws[0][0] if ws else 0.0
    return {
        "idle_gap_median_s": round(statistics.median(gaps), 3) if gaps else float("nan"),
        "idle_gap_max_s": round(max(gaps), 3) if gaps else float("nan"),
        "busy_share": round(covered / span, 3) if span > 0 else float("nan"),
    }


def publish_model(stack, state: Path, folder: Path, name: str | None) -> str:
    """Publish ``folder`` to the stack's models root and register it in its catalog with the operator's profile (what
    ``gpufleet admin models publish`` does for an operator); returns the model's name."""
    from gpufleet.cli.main import main as cli

    manifest = json.loads((state / "stack.json").read_text())
    name = name or folder.name
    code = cli(["admin", "models", "publish", str(folder), "--name", name, "--root", manifest["published models"],
                "--s3-endpoint", manifest["moto_endpoint"], "--profile", str(state / "profiles" / "operator.json"),
                "--json"])
    if code != 0:
        raise SystemExit(f"publishing {folder} as {name} failed (exit {code})")
    return name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--steps", default="10", help="denoising steps per job; a comma list (e.g. 10,50) alternates the "
                    "jobs over them, so the shapes' ratios come from one run (warm medians per step count)")
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--height", type=int, default=256)
    ap.add_argument("--model-folder", default=None, help="publish and register this Wan model folder on the stack and "
                    "run every job on it (default: the built-in wan-tiny)")
    ap.add_argument("--model-name", default=None, help="the name it is published under (default: the folder's name)")
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--timeline", action="store_true", help="also print each job's events, seconds from its creation "
                    "(and the attempt's phase durations on FINALIZING)")
    ap.add_argument("--burst", type=int, default=0, help="then submit this many jobs at once and report the GPU's idle "
                    "gaps between their runs")
    ap.add_argument("--burst-pool", default="onprem-a", help="the burst's jobs may run only on this pool (empty: any; "
                    "with the cost policy the jobs the node cannot take at once burst to the cloud pool)")
    ap.add_argument("--poll-s", type=float, default=0.5,
                    help="the client's status poll while it waits (`gpufleet demo` polls every 0.5 s; each poll is an "
                         "API request that the dev stack's foreground gate serves before background work)")
    args = ap.parse_args()
    step_counts = [int(x) for x in str(args.steps).split(",") if x.strip()]
    if not step_counts or min(step_counts) < 1:
        ap.error("--steps: one or more positive integers, comma-separated")

    from gpufleet.devstack.settings import DevSettings
    from gpufleet.devstack.stack import DevStack

    state = Path(args.state_dir or tempfile.mkdtemp(prefix="gpufleet-bench-"))
    stack = DevStack(DevSettings(state_dir=state, api_port=0, device="auto"), say=lambda text: None)
    t0 = time.monotonic()
    stack.start()
    out = stack.console
    start_s = time.monotonic() - t0
    model = publish_model(stack, state, Path(args.model_folder), args.model_name) if args.model_folder else None
    rows = []
    timeline: list[str] = []
    try:
        client = stack.client()
        for i in range(args.jobs):
            steps = step_counts[i % len(step_counts)]
            spec = {"workload": {"kind": "video.generate", "prompt": f"a red fox running in snow, take {i}",
                                 "frames": args.frames, "steps": steps, "width": args.width, "height": args.height,
                                 **({"model": model} if model else {})}}
            job = client.wait(client.submit(spec).job_id, timeout=args.timeout, poll_s=args.poll_s)
            if job.status.value != "SUCCEEDED":
                print(f"job {job.job_id} ended {job.status.value}", file=out)
                return 1
            events = client.events(job.job_id)
            rows.append({"job_id": job.job_id, "steps": steps, **phases(events, job.billing)})
            if args.timeline:
                t0_job = _ts(events[0].ts)
                for e in events:
                    d = e.detail if isinstance(e.detail, dict) else {}
                    phases_of = (d.get("phases") or {}).get("durations") or {}
                    timeline.append(f"  {job.job_id} {_ts(e.ts) - t0_job:7.3f} {e.type} {d.get('to', '')}"
                                    + (" " + json.dumps({k: round(v, 3) for k, v in phases_of.items()})
                                       if phases_of else ""))
        burst: dict = {}
        if args.burst:
            pin = {"pools": [args.burst_pool]} if args.burst_pool else {}
            ids = [client.submit({"workload": {"kind": "video.generate", "prompt": f"a heron fishing at dawn, take {i}",
                                               "frames": args.frames, "steps": step_counts[0]}, **pin}).job_id
                   for i in range(args.burst)]
            windows, pools = [], {}
            for job_id in ids:
                job = client.wait(job_id, timeout=args.timeout, poll_s=args.poll_s)
                if job.status.value != "SUCCEEDED":
                    print(f"job {job.job_id} ended {job.status.value}", file=out)
                    return 1
                windows.append(run_window(client.events(job_id)))
                pool = (job.placement or {}).get("pool", "?")
                pools[pool] = pools.get(pool, 0) + 1
            burst = {"burst_jobs": args.burst, **burst_figures(windows), "burst_pools": pools}
    finally:
        stack.stop()
    print(f"stack start: {start_s:.1f} s (device {stack.device})")
    cols = ["steps", "admission_s", "placement_s", "run_s", "denoise_s", "finalize_s", "total_s", "overhead_ratio",
            "total_over_denoise"]
    print("job  " + "  ".join(f"{c:>15}" for c in cols))
    for i, r in enumerate(rows):
        print(f"{i:<4} " + "  ".join(f"{r[c]:15.2f}" for c in cols))
    for line in timeline:
        print(line)
    warm = rows[1:] or rows
    summary = {
        "stack_start_s": round(start_s, 2),
        "jobs": len(rows),
        "cold_total_s": round(rows[0]["total_s"], 2),
        "warm_total_s_median": round(statistics.median(r["total_s"] for r in warm), 2),
        "warm_run_s_median": round(statistics.median(r["run_s"] for r in warm), 2),
        "warm_overhead_ratio_median": round(statistics.median(r["overhead_ratio"] for r in warm), 2),
        "warm_denoise_s_median": round(statistics.median(r["denoise_s"] for r in warm), 2),
        "warm_finalize_s_median": round(statistics.median(r["finalize_s"] for r in warm), 2),
        "warm_total_over_denoise_median": round(statistics.median(r["total_over_denoise"] for r in warm), 2),
        "cold_over_warm_total": round(rows[0]["total_s"] / statistics.median(r["total_s"] for r in warm), 2),
    }
    if len(step_counts) > 1:  # the same figures per step count, warm jobs only: side by side from one run
        summary["by_steps"] = {
            str(n): {
                "warm_jobs": len(sel),
                "warm_total_s_median": round(statistics.median(r["total_s"] for r in sel), 2),
                "warm_denoise_s_median": round(statistics.median(r["denoise_s"] for r in sel), 2),
                "warm_total_minus_denoise_s_median": round(statistics.median(r["total_s"] - r["denoise_s"] for r in sel), 2),
                "warm_total_over_denoise_median": round(statistics.median(r["total_over_denoise"] for r in sel), 2),
            }
            for n in step_counts
            if (sel := [r for r in warm if r["steps"] == n])
        }
    if burst:
        print(f"burst of {burst['burst_jobs']}: idle gap between runs median {burst['idle_gap_median_s']} s, max "
              f"{burst['idle_gap_max_s']} s; runs covered {burst['busy_share']:.0%} of the span; pools {burst['burst_pools']}")
        summary.update(burst)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
