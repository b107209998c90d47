"""Entry point of the ``gpufleet`` console script.

Sub-commands are registered in :data:`COMMANDS`; each is a module exposing
``register(subparsers)``. Errors from :mod:`gpufleet.errors` become one line on
stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gpufleet.errors import GpufleetError

#: sub-command name → module implementing ``register(subparsers)``
COMMANDS: dict[str, str] = {
    "submit": "gpufleet.cli.submit",
    "status": "gpufleet.cli.status",
    "ls": "gpufleet.cli.ls",
    "events": "gpufleet.cli.events",
    "deliveries": "gpufleet.cli.deliveries",
    "logs": "gpufleet.cli.logs",
    "cancel": "gpufleet.cli.cancel",
    "output": "gpufleet.cli.output",
    "verify": "gpufleet.cli.verify",
    "quota": "gpufleet.cli.quota",
    "pools": "gpufleet.cli.pools",
    "models": "gpufleet.cli.models",
    "dev": "gpufleet.cli.dev",
    "demo": "gpufleet.cli.demo",
    "simulate": "gpufleet.cli.simulate",
    "agent": "gpufleet.cli.agent",
    "admin": "gpufleet.cli.admin",
    "recovery": "gpufleet.cli.recovery",
    "costs": "gpufleet.cli.costs",
    "diagnose": "gpufleet.cli.diagnose",
    "webhooks": "gpufleet.cli.webhooks",
    "safety": "gpufleet.cli.safety",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description="Run GPU jobs across on-prem machines and AWS.")
    sub = parser.add_subparsers(dest="command", required=True)
    for _name, module in COMMANDS.items():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GpufleetError as err:
        print(f"gpufleet: error: {err.detail}", file=sys.stderr)
        return 1 if err.status < 500 else 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
