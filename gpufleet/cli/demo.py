"""``gpufleet demo`` (``make demo``): one real text-to-video job through the whole local stack.

Steps, each printed as it happens:

1. start the embedded stack (``gpufleet dev``'s stack, in its own state directory);
2. submit a ``video.generate`` job through the SigV4 gateway and the real API handler;
3. wait, showing status and denoising step, while the state machine, the scheduler pass, the
   on-prem agent, the runtime and the finalize stage do their work;
4. download ``out/<job-id>.mp4``, decode every frame with PyAV, verify the C2PA manifest against
   the development trust anchor and recover the watermark;
5. print the job's timeline, then stop the stack.

Exit 0 only if the job SUCCEEDED and its video decoded and verified. Nothing is simulated: a step
that cannot run says so and the demo fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gpufleet.cli.common import (
    EXIT_JOB_UNSUCCESSFUL,
    EXIT_OK,
    EXIT_SERVICE,
    EXIT_TIMEOUT,
    EXIT_VERIFY_FAILED,
    ProgressPrinter,
)

DEMO_PROMPT = "a red fox running through fresh snow in a forest"
DEMO_SPEC: dict[str, Any] = {
    "workload": {
        "kind": "video.generate",
        "prompt": DEMO_PROMPT,
        "frames": 9,
        "width": 256,
        "height": 256,
        "steps": 10,
    },
    "labels": {"source": "gpufleet-demo"},
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run one text-to-video job end to end on the local stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state-dir", default=".gpufleet/demo", help="state of the demo's stack (default .gpufleet/demo)")
    p.add_argument("--out-dir", default="out", help="where the video goes (default out/)")
    p.add_argument("--prompt", default=DEMO_PROMPT)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the job (default 240)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="what the agent runs the job on")
    p.set_defaults(func=run)


class Steps:
    """Numbered, timed progress lines on ``out``."""

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        self.total, self.n, self.out = total, 0, out or sys.stdout
        self.t0 = time.monotonic()

    def step(self, text: str) -> None:
        self.n += 1
        self.say(f"[{self.n}/{self.total}] {text}")

    def say(self, text: str, out: TextIO | None = None) -> None:
        print(f"{time.monotonic() - self.t0:6.1f}s  {text}", file=out or self.out, flush=True)


def inspect_video(path: Path) -> dict[str, Any]:
    """Decode every frame with PyAV; report count and size (raises if the file does not decode)."""
    from gpufleet.provenance.video import decode_mp4

    frames = decode_mp4(path)
    return {"frames": int(frames.shape[0]), "width": int(frames.shape[2]), "height": int(frames.shape[1])}


def run_job(
    client, spec: dict[str, Any], out_dir: Path, trust_anchors: str | None, steps: Steps, timeout: float,
    watermark_keys: Path | None = None,
) -> int:
    """Steps 2-5 against a running stack; returns the exit code. Used by the demo and its tests."""
    from gpufleet.cli.events import timeline_table
    from gpufleet.cli.output import format_report, verify_file
    from gpufleet.errors import WaitTimeout

    w = spec["workload"]
    job = client.submit(spec)
    steps.step(
        f"submitted {job.job_id}: {w['prompt']!r} ({w['frames']} frames {w['width']}x{w['height']}, {w['steps']} steps)"
    )
    steps.step("waiting for the job (scheduler → agent → runtime → finalize)")
    try:
        job = client.wait(job.job_id, timeout=timeout, poll_s=0.5, on_update=ProgressPrinter(steps.out))
    except WaitTimeout as err:
        steps.say(f"gave up: {err.detail}")
        _print_timeline(client, job.job_id, steps, timeline_table)
        return EXIT_TIMEOUT
    if job.status.value != "SUCCEEDED":
        steps.say(f"the job ended {job.status.value}")
        _print_timeline(client, job.job_id, steps, timeline_table)
        return EXIT_JOB_UNSUCCESSFUL
    output = client.output(job.job_id)
    files = client.download_output(job.job_id, out_dir, output)
    video = files["video"]
    info = inspect_video(video)
    steps.step(
        f"wrote {video} ({video.stat().st_size} bytes; PyAV decoded {info['frames']} frames "
        f"{info['width']}x{info['height']})"
    )
    from gpufleet.provenance.keys import load_watermark_keys

    wm_keys = load_watermark_keys(watermark_keys) if watermark_keys else ()
    report = verify_file(job.job_id, video, trust_anchors, output.watermark_payload, wm_keys)
    for line in format_report(report):
        steps.say("      " + line)
    _print_timeline(client, job.job_id, steps, timeline_table)
    billing = job.billing or {}
    if billing:
        steps.say(
            f"billing: charged={billing.get('charged')} gpu_seconds={billing.get('gpu_seconds')} "
            f"usd={billing.get('amount_usd')}"
        )
    return EXIT_OK if report["ok"] else EXIT_VERIFY_FAILED


def _print_timeline(client, job_id: str, steps: Steps, timeline_table) -> None:
    steps.step("timeline")
    for line in timeline_table(client.events(job_id)).splitlines():
        steps.say("      " + line)


def run(args: argparse.Namespace) -> int:
    from gpufleet.devstack.settings import DevSettings
    from gpufleet.devstack.stack import DevStack

    steps = Steps(total=5)
    spec = {**DEMO_SPEC, "workload": {**DEMO_SPEC["workload"], "prompt": args.prompt}}
    settings = DevSettings(state_dir=Path(args.state_dir), api_port=0, console_port=0, device=args.device)
    steps.step(f"starting the local stack (state and logs in {settings.state_dir})")
    stack = DevStack(settings, say=lambda text: steps.say("      " + text, out=stack.console))
    code = EXIT_SERVICE
    try:
        stack.start()
        steps.out = stack.console  # this process's stdout now goes to the stack's log
        for line in stack.banner():
            steps.say("      " + line)
        code = run_job(stack.client(), spec, Path(args.out_dir), stack.trust_anchors_pem(), steps, args.timeout,
                       watermark_keys=stack.keys.watermark_keys)
    finally:
        failures = stack.stop()
        steps.out = sys.stdout
        for name, err in failures:
            steps.say(f"stopping {name} failed: {err}")
        steps.say("stopped the local stack")
    verdict = {
        EXIT_OK: "demo succeeded",
        EXIT_TIMEOUT: "demo failed: the job did not finish in time",
        EXIT_JOB_UNSUCCESSFUL: "demo failed: the job did not succeed",
        EXIT_VERIFY_FAILED: "demo failed: the video did not verify",
        EXIT_SERVICE: "demo failed: the local stack did not run",
    }[code]
    steps.say(f"{verdict} (logs: {settings.state_dir / 'logs'})")
    return code if not failures else (code or EXIT_SERVICE)
