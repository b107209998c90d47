"""``gpufleet dev``: start the embedded local stack and keep it running until Ctrl-C.

Starts a moto server with gpufleet's patches, deploys the synthesized CDK template into it,
serves the API on 127.0.0.1 through the SigV4-verifying gateway, starts an on-prem agent
(local GPU, else CPU), the local runner of the cloud pool and the scheduler pass timer, creates
development signing keys, and writes a CLI profile (``<state-dir>/profile.json``) that every
other command and the SDK read. All state lives in ``--state-dir`` (default ``./.gpufleet``);
logs are in ``<state-dir>/logs/``.

Prints where everything is once ready; Ctrl-C (or SIGTERM) stops everything cleanly (the agent
drains first) and exits 0. Exit 2 if the stack cannot start or a part of it dies.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

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
    p.add_argument("--moto-port", type=int, default=0, help="moto server port (default: a free one)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="what the agent runs jobs on")
    p.add_argument("--no-agent", action="store_true", help="do not start the on-prem agent")
    p.add_argument("--scheduler-interval", type=float, default=1.0, help="seconds between scheduler passes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.devstack.settings import DevSettings
    from gpufleet.devstack.stack import DevStack

    settings = DevSettings(
        state_dir=Path(args.state_dir),
        api_port=args.port,
        moto_port=args.moto_port,
        device=args.device,
        agent=not args.no_agent,
        scheduler_interval_s=args.scheduler_interval,
    )
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
    return code if not failures else EXIT_SERVICE
