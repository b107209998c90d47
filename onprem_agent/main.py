"""Command line of the agent: ``python -m onprem_agent`` / ``gpufleet agent``.

``--check`` prints a JSON health report and exits 0 (healthy), 1 (unhealthy) or
2 (invalid configuration). ``--scrub-cache`` hashes every entry of the node cache in full now (remembered digests
ignored: docs/runtime.md "Remembered digests"), removes those that no longer match, prints a JSON report and exits
0 (none corrupt), 1 (corrupt entries found) or 2 (invalid configuration, or no cache at ``cache_dir``); it may run
beside the agent. Without either the agent runs until SIGTERM (exit 0 after a drain, 1 after a second signal).
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
    parser.add_argument("--scrub-cache", action="store_true",
                        help="hash every node-cache entry in full now, remove corrupt ones; exit 1 if any were found")


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
    if args.scrub_cache:
        return scrub_cache(settings, clock)
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


def scrub_cache(settings, clock) -> int:
    """``--scrub-cache`` (see module)."""
    from gpufleet.runtime.hostcache import ContentCache

    if not settings.cache_dir.is_dir():
        print(f"gpufleet agent: no node cache at {settings.cache_dir} (cache_dir)", file=sys.stderr)
        return health.BAD_CONFIG
    cache = ContentCache(settings.cache_dir, settings.cache_max_bytes, settings.cache_min_age_s, clock=clock,
                         reverify_s=settings.cache_reverify_s)
    report = cache.scrub().as_dict()
    print(json.dumps(report, indent=2))
    return health.UNHEALTHY if report["corrupt"] else health.HEALTHY
