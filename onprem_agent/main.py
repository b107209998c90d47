"""Command line of the agent: ``python -m onprem_agent`` / ``gpufleet agent``.

``--check`` prints a JSON health report and exits 0 (healthy), 1 (unhealthy) or
2 (invalid configuration); without it the agent runs until SIGTERM (exit 0
after a drain, 1 after a second signal).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping

from gpufleet.clock import SystemClock
from gpufleet.errors import ConfigError, GpufleetError
from onprem_agent import health
from onprem_agent.logs import configure
from onprem_agent.settings import load_settings

DEFAULT_CONFIG = "/etc/gpufleet/agent.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"TOML settings file (default: $GPUFLEET_AGENT_CONFIG or {DEFAULT_CONFIG} if present)")
    parser.add_argument("--check", action="store_true", help="health check: print a JSON report, exit 0 if healthy")
    parser.add_argument("--node-id", default=None, help="override node_id")


def config_path(arg: str | None, environ: Mapping[str, str]) -> str | None:
    if arg:
        return arg
    env = environ.get("GPUFLEET_AGENT_CONFIG")
    if env:
        return env
    return DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None


def run(args: argparse.Namespace) -> int:
    """The entry point's wiring: the environment is read here, once; settings, environment and
    clock are passed down."""
    environ = dict(os.environ)
    clock = SystemClock()
    try:
        settings = load_settings(config_path(args.config, environ), environ, overrides={"node_id": args.node_id})
    except ConfigError as err:
        if args.check:
            print(json.dumps({"healthy": False, "checks": {"settings": {"ok": False, "detail": err.detail}}}))
            return health.BAD_CONFIG
        raise
    if args.check:
        rep = health.check(settings, clock=clock, environ=environ)
        print(json.dumps(rep.as_dict(), indent=2))
        return health.HEALTHY if rep.ok else health.UNHEALTHY
    configure(settings.log_level, node=settings.node_id)
    from onprem_agent.agent import Agent

    return Agent(settings, clock=clock, environ=environ).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-agent", description="Run gpufleet jobs on this host's GPUs.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as err:
        print(f"gpufleet-agent: error: {err.detail}", file=sys.stderr)
        return health.BAD_CONFIG
    except GpufleetError as err:  # e.g. AWS unreachable at start-up: systemd restarts us
        print(f"gpufleet-agent: error: {err.detail}", file=sys.stderr)
        return 1
