"""Run the runtime in fresh processes forked from a pre-warmed server (torch and diffusers already imported).

Contract: :class:`PrewarmedLauncher` wraps a ``multiprocessing`` *forkserver*
context whose server imports the heavy modules once. Each :meth:`start` forks a
new process from that server (no state from earlier runs; its own pid, so
signals reach it alone) that sets ``env``, redirects stdout to
``stdout_path`` and runs :func:`gpufleet.runtime.main.main` with ``argv``; the
process exit code is the runtime's exit code. Used by tests and tools that
start many short runs; the agent and the container run ``python -m gpufleet.runtime``.

:meth:`PrewarmedLauncher.run_module` is ``python -m MODULE ARGS`` in such a fork:
the module runs as ``__main__`` (``runpy``) in a session of its own (its process
group is its pid), with exactly ``env`` as its environment, in ``cwd``, its
stdout and stderr those of the server; its exit status is what ``SystemExit``
said (a message: printed, status 1; an uncaught exception: its traceback,
status 1), or ``-N`` when signal N ended it, as ``subprocess`` reports it.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import traceback

PRELOAD = [
    "torch",
    "accelerate",
    "diffusers.pipelines.wan.pipeline_wan",
    "diffusers.models.transformers.transformer_wan",
    "diffusers.models.autoencoders.autoencoder_kl_wan",
    "diffusers.schedulers.scheduling_flow_match_euler_discrete",
    "transformers.models.umt5.modeling_umt5",
    "transformers.models.t5.tokenization_t5",
    "gpufleet.runtime.generate",
    "gpufleet.runtime.main",
    "boto3",
]


def _child(argv: list[str], env: dict[str, str], stdout_path: str) -> None:
    os.environ.update(env)
    fd = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    from gpufleet.runtime.main import main

    code = main(argv)
    sys.stdout.flush()
    os._exit(code)


def _module_child(module: str, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    if cwd:
        os.chdir(cwd)
    sys.argv = [module, *argv]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class PrewarmedLauncher:
    def __init__(self, preload: list[str] | None = None) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(preload or PRELOAD)

    def start(self, argv: list[str], env: dict[str, str], stdout_path: str):
        proc = self.ctx.Process(target=_child, args=(argv, env, stdout_path), daemon=False)
        proc.start()
        return proc

    def run_module(self, module: str, argv: list[str], env: dict[str, str], cwd: str | None = None):
        """Start ``python -m module *argv`` as a fork of the server (see the module's docstring)."""
        proc = self.ctx.Process(target=_module_child, args=(module, argv, env, cwd), daemon=False)
        proc.start()
        return proc
