"""``gpufleet status JOB``: one job's status, progress, placement (a gang: each member's node, GPUs and state),
billing and output."""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, describe_workload, make_client, print_json
from gpufleet.sdk_models import Job


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show one job")
    p.add_argument("job_id")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def phase_text(phases: dict) -> str:
    """``dispatch 0.4s, start 2.1s, model_load 3.0s (miss, 1.2 GB), ..., GPU busy 83% (40 samples)`` (pure); the
    GPU-busy share reads ``not measured`` when the runtime could not sample it (a CPU run, no NVML)."""
    parts = []
    for name, seconds in phases.get("durations", {}).items():
        text = f"{name} {float(seconds):.1f}s"
        if name == "model_load" and phases.get("model_cache"):
            size = f", {int(phases.get('model_bytes') or 0) / 1e9:.1f} GB" if phases.get("model_bytes") else ""
            text += f" ({phases['model_cache']}{size})"
        if name == "steps" and phases.get("mean_step_s") is not None:
            text += f" ({phases.get('steps')} steps, {float(phases['mean_step_s']):.2f}s each)"
        parts.append(text)
    if parts:  # measured by the runtime through NVML, else said so: never a made-up number
        busy = phases.get("gpu_busy")
        parts.append(f"GPU busy {float(busy) * 100:.0f}% ({phases.get('gpu_busy_samples', 0)} samples)"
                     if busy is not None else "GPU busy not measured")
    return ", ".join(parts)


def describe(job: Job) -> list[tuple[str, str]]:
    """Human-readable fields of a job, in display order (pure)."""
    rows: list[tuple[str, str]] = [("job", job.job_id), ("status", job.status.value)]
    rows.append(("kind", str(job.workload.get("kind", ""))))
    rows.append(("workload", describe_workload(job)))
    if job.progress and job.progress.total:
        rows.append(("progress", f"step {job.progress.step}/{job.progress.total}"))
    if job.scheduling and job.scheduling.get("reason"):
        retry = f" (next try {job.scheduling['retry_at']})" if job.scheduling.get("retry_at") else ""
        rows.append(("waiting", f"{job.scheduling['reason']}{retry}"))
    links: dict[str, str] = {}
    if job.placement:
        where = " ".join(str(job.placement[k]) for k in ("target", "pool", "node") if job.placement.get(k))
        gpus = ",".join(str(g) for g in job.placement.get("gpu_indices") or [])
        link = str(job.placement.get("gpu_link") or "")
        links = {str(m.get("node")): str(m.get("gpu_link") or "") for m in job.placement.get("members") or []}
        shown = f" gpus {gpus}" + (f" (topology: {link})" if link else "") if gpus and not links else ""
        rows.append(("placement", f"{where}{shown} (epoch {job.placement.get('epoch', '?')})"))
    for m in job.members or []:  # a gang: one row per member
        gpus = ",".join(str(g) for g in m.get("gpus") or []) or "-"
        link = links.get(str(m.get("node")), "")
        rows.append((f"member {m.get('rank')}",
                     f"{m.get('node')} gpus {gpus}{f' (topology: {link})' if link else ''} {m.get('state')}"))
    for key in ("created_at", "updated_at"):
        if getattr(job, key):
            rows.append((key.replace("_at", ""), str(getattr(job, key))))
    if job.traceparent:
        rows.append(("trace", job.traceparent))
    phases = (job.last_run or {}).get("phases") or {}
    if phases.get("durations"):
        rows.append(("phases", phase_text(phases)))
    if job.billing:
        b = job.billing
        text = f"charged={b.get('charged')} gpu_seconds={b.get('gpu_seconds')} usd={b.get('amount_usd')}"
        if b.get("waiver"):
            text += f" waiver={b['waiver']}"
        rows.append(("billing", text))
    if job.output:
        rows.append(("output", str(job.output.get("video_key", job.output))))
    extra = job.model_extra or {}
    for key in ("error", "reason", "failure", "cancel_requested"):
        if extra.get(key):
            rows.append((key, str(extra[key])))
    return rows


def run(args: argparse.Namespace) -> int:
    job = make_client(args).get(args.job_id)
    if args.json:
        print_json(job)
        return EXIT_OK
    rows = describe(job)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return EXIT_OK
