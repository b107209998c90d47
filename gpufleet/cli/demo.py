"""``gpufleet demo``: what exists so far, run end to end (replaced by the full demo later)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the local end-to-end demo")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.spec import JobSpec

    spec = JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}})
    print("gpufleet demo: the embedded stack is not built yet.")
    print("Validated a text-to-video job spec:", spec.model_dump_json())
    return 0
