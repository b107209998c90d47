"""``gpufleet agent [--config F] [--check]``: run the on-prem agent (see docs/agent.md)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p: argparse.ArgumentParser = sub.add_parser("agent", help="run the on-prem GPU agent (or --check its health)")
    from onprem_agent.main import add_arguments

    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from onprem_agent.main import run

    return run(args)
