"""The embedded stack under concurrent signed submissions, then Ctrl-C with their executions in flight.

Opt-in (its own ``gpufleet dev`` start, ~1-2 min on 2 shared cores): ``GPUFLEET_E2E_ADMISSION=1``.
``benchmarks/devstack_admission.py`` is the measurement; this is its correctness check: submissions sent
concurrently from many threads through the SigV4 gateway (each one twice, concurrently, with the same
Idempotency-Key, as a client retrying) are neither lost nor duplicated, every job reaches PENDING (pool
``onprem-a`` with no agent: parked), and Ctrl-C with those executions parked and a second burst still
being admitted stops within 15 s, and the API process (its own process: gpufleet.devstack.api_process) ends with
it.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from stack_helpers import READY_TIMEOUT_S, StackProcess, World, wait_for

from gpufleet.store.dynamo import unmarshal

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e-admission"),
              pytest.mark.skipif(os.environ.get("GPUFLEET_E2E_ADMISSION") != "1",
                                 reason="opt-in (its own stack, ~1-2 min): GPUFLEET_E2E_ADMISSION=1")]

JOBS = 24
USERS = 3
STOP_BOUND_S = 15.0


def process_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it is not this test's child to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_concurrent_signed_submissions_are_admitted_once_and_ctrl_c_stops_in_time(tmp_path):
    from gpufleet.devstack.principals import add_principal
    from gpufleet.profile import load_profile
    from gpufleet.sdk import Client
    from gpufleet.store.principals import put_principal

    stack = StackProcess(tmp_path, ["--no-agent", "--port", "0", "--console-port", "0"])
    world = World(stack.start(READY_TIMEOUT_S))
    try:
        clients = []
        for i in range(USERS):
            arn, profile = add_principal(tmp_path, f"load{i}")
            put_principal(world.c("dynamodb"), world.tables["control"], arn, "dev", "local", f"load{i}")
            clients.append(Client(profile=load_profile(profile)))
        keys = [str(uuid.uuid4()) for _ in range(2 * JOBS)]

        def submit(n: int) -> tuple[int, str]:
            i = n % JOBS + (JOBS if n >= 2 * JOBS else 0)  # every submission of the first burst twice, same key
            spec = {"workload": {"kind": "video.generate", "prompt": f"a heron in the reeds, take {i}"},
                    "pools": ["onprem-a"], "labels": {"load-index": str(i)}}
            return i, clients[i % USERS].submit(spec, idempotency_key=keys[i]).job_id

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(submit, range(2 * JOBS)))
        by_index: dict[int, set[str]] = {}
        for i, job_id in answers:
            by_index.setdefault(i, set()).add(job_id)
        assert all(len(ids) == 1 for ids in by_index.values()) and len(by_index) == JOBS  # one job per key

        def job_items() -> list[dict]:
            items = [unmarshal(r) for r in world.c("dynamodb").scan(TableName=world.tables["jobs"])["Items"]]
            return [it for it in items if str(it.get("pk", "")).startswith("JOB#") and it.get("sk") == "META"]

        wanted = set().union(*by_index.values())

        def all_pending() -> list[dict] | None:
            metas = job_items()
            return metas if {m["job_id"] for m in metas if m.get("status") == "PENDING"} >= wanted else None

        metas = wait_for(all_pending, 180, interval=1.0, what="every job PENDING")
        assert len(metas) == JOBS  # none lost, none duplicated
        assert sorted(int(m["spec"]["labels"]["load-index"]) for m in metas) == list(range(JOBS))
        sfn = world.c("stepfunctions")
        running = sfn.list_executions(stateMachineArn=world.state_machine_arn, statusFilter="RUNNING")["executions"]
        assert len(running) == JOBS  # parked on their placement token
        # a second burst, still being admitted (stream consumer, CheckPrompt, workflow starts) at the Ctrl-C
        with ThreadPoolExecutor(max_workers=16) as pool:
            second = list(pool.map(lambda n: submit(2 * JOBS + n), range(JOBS)))
        assert sorted(i for i, _ in second) == list(range(JOBS, 2 * JOBS))
        api_pids = world.m["api"]["pids"]
        assert api_pids and world.m["pid"] not in api_pids and all(process_running(p) for p in api_pids)
        t0 = time.monotonic()
        assert stack.stop(timeout_s=60) == 0
        assert time.monotonic() - t0 < STOP_BOUND_S
        assert wait_for(lambda: not any(process_running(p) for p in api_pids) or None, 10, interval=0.2,
                        what="the API processes ended")
    finally:
        stack.kill()
