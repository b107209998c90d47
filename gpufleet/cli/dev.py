"""``gpufleet dev``: start the embedded local stack and keep it running until Ctrl-C.

Starts a moto server with gpufleet's patches, deploys the synthesized CDK template into it,
serves the API on 127.0.0.1 through the SigV4-verifying gateway, starts on-prem agents
(--agents N; local GPU, else CPU), the local runner of the cloud pool and the scheduler pass
timer, creates development signing keys, and writes a CLI profile (``<state-dir>/profile.json``)
that every other command and the SDK read. All state lives in ``--state-dir`` (default
``./.gpufleet``); logs are in ``<state-dir>/logs/``; ``<state-dir>/stack.json`` says where
everything is (agents with node id, pid and log; the moto endpoint, tables, buckets, state machine).

Rehearsing failures: kill or pause (SIGSTOP) an agent by its pid; with --runtime-env set runtime
settings of every job (e.g. GPUFLEET_CHECKPOINT_EVERY_STEPS=2); with --imds-endpoint point
spot-pool jobs at a loopback metadata service that can announce a spot interruption.

``gpufleet dev --add-principal NAME`` starts nothing: it gives the stack running in ``--state-dir`` a new
local IAM principal (``arn:aws:iam::123456789012:user/NAME``) with its own access key, which that stack's
gateway accepts at once, and writes its profile ``<state-dir>/profiles/NAME.json``; map the ARN to a tenant,
team and user with ``gpufleet admin user add`` (the operator's profile is ``<state-dir>/profiles/operator.json``).

Prints where everything is once ready; Ctrl-C (or SIGTERM) stops everything cleanly (the agents
drain first) and exits 0. Exit 2 if the stack cannot start or a part of it dies (every agent
exited, or every scheduler pass fails); an agent that exits while others run is reported only.
Once the stack has stopped the process ends without the interpreter's teardown (:func:`exit_now`).
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from gpufleet.cli.common import EXIT_OK, EXIT_SERVICE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dev",
        help="run the embedded local stack (Ctrl-C stops it)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state-dir", default=".gpufleet", help="all state of the stack (default ./.gpufleet)")
    p.add_argument("--port", type=int, default=8642, help="API port on 127.0.0.1 (0 picks a free one; default 8642)")
    p.add_argument("--console-port", type=int, default=8643,
                   help="web console port on 127.0.0.1 (0 picks a free one; default 8643)")
    p.add_argument("--moto-port", type=int, default=0, help="moto server port (default: a free one)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="what the agents run jobs on")
    p.add_argument("--no-agent", action="store_true", help="do not start any on-prem agent")
    p.add_argument(
        "--agents",
        type=int,
        default=1,
        metavar="N",
        help="on-prem agent processes, 1..8 (nodes dev-node-1 .. dev-node-N; default 1)",
    )
    p.add_argument("--warm-workers", action=argparse.BooleanOptionalAction, default=True,
                   help="agents run the generate stage on warm workers that keep the model loaded (default: on)")
    p.add_argument("--scheduler-interval", type=float, default=1.0, help="seconds between scheduler passes")
    p.add_argument("--scheduler-idle-max", type=float, default=8.0,
                   help="the timer's longest period: passes that find nothing to do double it up to this")
    p.add_argument(
        "--heartbeat-seconds",
        type=int,
        default=20,
        metavar="S",
        help="HeartbeatSeconds of the Run state: how long a silent agent is trusted (>= 5; default 20)",
    )
    p.add_argument("--finalize-lambda-max-pixels", type=int, default=None, metavar="N",
                   help="clips of at most N frames x delivered pixels finalize in the warm finalize Lambda, larger "
                   "ones as a Batch job (default: the deployment's bound)")
    p.add_argument(
        "--runtime-env",
        action="append",
        default=[],
        metavar="GPUFLEET_SETTING=VALUE",
        help="a runtime setting for every job, on the agents and the cloud runner (repeatable)",
    )
    p.add_argument(
        "--imds-endpoint",
        default=None,
        metavar="URL",
        help="loopback instance metadata service for spot-pool jobs (spot interruption notices)",
    )
    p.add_argument("--add-principal", metavar="NAME",
                   help="add a local IAM principal with its own profile to the running stack, then exit")
    p.add_argument("--json", action="store_true", help="with --add-principal: print {arn, profile} as JSON")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):
    """:class:`~gpufleet.devstack.settings.DevSettings` from the parsed options (ConfigError if invalid)."""
    from gpufleet.devstack.settings import load, parse_assignments

    return load(
        state_dir=Path(args.state_dir),
        api_port=args.port,
        console_port=args.console_port,
        moto_port=args.moto_port,
        device=args.device,
        agent=not args.no_agent,
        agents=args.agents,
        warm_workers=args.warm_workers,
        scheduler_interval_s=args.scheduler_interval,
        scheduler_idle_max_s=args.scheduler_idle_max,
        heartbeat_seconds=args.heartbeat_seconds,
        finalize_lambda_max_pixels=args.finalize_lambda_max_pixels,
        runtime_env=parse_assignments(args.runtime_env),
        imds_endpoint=args.imds_endpoint,
    )


def add_principal(args: argparse.Namespace) -> int:
    from gpufleet.cli.common import print_json
    from gpufleet.devstack.principals import add_principal as add

    arn, profile = add(Path(args.state_dir), args.add_principal)
    if args.json:
        print_json({"arn": arn, "profile": str(profile)})
    else:
        print(f"{arn}\nprofile: {profile}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from gpufleet.devstack.stack import DevStack

    if args.add_principal:
        return add_principal(args)
    settings = settings_from_args(args)
    stop = threading.Event()
    stack = DevStack(settings, prefix="gpufleet dev: ")

    def on_signal(signum, _frame):
        print(f"\ngpufleet dev: {signal.Signals(signum).name}, stopping", file=stack.console_err, flush=True)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    code = EXIT_OK
    try:
        stack.start()
        for line in stack.banner():
            print(line, file=stack.console, flush=True)
        stack.say("ready (Ctrl-C to stop)")
        while not stop.wait(1.0):
            for notice in stack.health_notices():
                print(f"gpufleet dev: warning: {notice}", file=stack.console_err, flush=True)
            problem = stack.health_problem()
            if problem:
                print(f"gpufleet dev: error: {problem}", file=stack.console_err, flush=True)
                code = EXIT_SERVICE
                break
    finally:
        failures = stack.stop()
        for name, err in failures:
            print(f"gpufleet dev: error: stopping {name} failed: {err}", file=stack.console_err, flush=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
    stack.say("stopped")
    exit_now(code if not failures else EXIT_SERVICE)


def exit_now(code: int) -> NoReturn:
    """End the process once the stack has stopped: the ``atexit`` handlers run and the output is flushed, but
    the interpreter's teardown is skipped (freeing a stack that held a few hundred executions took ~10 s of the
    Ctrl-C; docs/benchmarks.md, "Embedded stack: admission under load and Ctrl-C"). Every part of the stack
    has stopped and written what it keeps by then."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
