"""An orphaned runtime checkpoints once and exits PREEMPTED, however many parent-death SIGTERMs reach it.

The runtime (``gpufleet.runtime.main`` in a process forked from the pre-warmed server) runs under a
stand-in agent process (``orphan_agent.run``: several threads, the runtime forked from one of them with
``PR_SET_PDEATHSIG`` = SIGTERM, as ``onprem_agent.child.spawn`` does). Each round SIGKILLs the agent
mid-generation and, as the kernel does while it re-parents the orphan across the agent's dying
threads, the orphan is sent SIGTERM again three times at once. The orphan must checkpoint the step it
reached, print its PREEMPTED result and exit; the next attempt (a new epoch, a new agent) resumes from
exactly that checkpoint. A few rounds, a few seconds each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import psutil
import pytest
from orphan_agent import run as agent_main

from gpufleet.store.fencing import issue_epoch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("runtime-torch")]

STEPS = 60
EVERY = 8  # periodic checkpoints every 8 steps: an orphan that exits without its own loses up to this
ROUNDS = 3


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_agent_killed_again_and_again_loses_no_more_than_the_step_in_flight(moto_server, launcher, tiny_cache,
                                                                              tmp_path, rt):
    endpoint, aws = moto_server
    spec = rt.video_spec(steps=STEPS)
    aws.put_job("job_orphan", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=EVERY)
    previous = None
    for epoch in range(1, ROUNDS + 1):
        if epoch > 1:
            issue_epoch(aws.ddb, aws.tables.jobs, "job_orphan", epoch - 1)  # the lifecycle's retry: a new epoch
        out, pid_file = tmp_path / f"e{epoch}.jsonl", tmp_path / f"e{epoch}.pid"
        argv = ["--envelope-json", json.dumps(aws.envelope("job_orphan", epoch, spec))]
        agent = launcher.ctx.Process(target=agent_main, args=(argv, env, str(out), str(pid_file)))
        agent.start()
        start = previous or 0

        def progress(out=out) -> int:
            return max((e["step"] for e in rt.read_events(out) if e.get("event") == "progress"), default=-1)

        rt.wait_for(lambda: pid_file.exists() and progress() >= start + 3, timeout=120)  # noqa: B023
        reached = progress()
        orphan = int(pid_file.read_text())
        os.kill(agent.pid, signal.SIGKILL)
        for _ in range(3):  # the parent-death signal again, as while re-parented across the dying threads
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGTERM)
        agent.join(30)
        rt.wait_for(lambda: _gone(orphan), timeout=60)  # noqa: B023

        results = [e for e in rt.read_events(out) if e.get("event") == "result"]
        assert results and results[-1]["exit_code"] == "PREEMPTED", f"round {epoch}: {out.read_text()[-2000:]}"
        pointer = aws.job("job_orphan")["checkpoint"]
        assert pointer["step"] >= reached, f"round {epoch}: checkpoint at {pointer['step']}, the job had reached {reached}"
        resumed = [e["step"] for e in rt.read_events(out) if e.get("event") == "resumed"]
        assert resumed == ([previous] if previous else []), f"round {epoch} resumed from {resumed}, expected {previous}"
        previous = pointer["step"]
    assert previous < STEPS
