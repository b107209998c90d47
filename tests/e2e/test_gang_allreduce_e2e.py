"""Issue 14's gang acceptance end to end, on a stack of its own (opt-in, not in ``make test``).

A three-agent ``gpufleet dev`` stack (every agent on this host, so its tenant containers run with
``gang_network`` ``local``: a gang attempt's members share one loopback-only network namespace) and the torch
image built from this host's files (:mod:`gpufleet.local.torch_image`, with ``docs/examples/gang_allreduce.py``
as ``/app/allreduce.py``). Both jobs are the docs' gang example (``docs/examples/gang_allreduce.json``: two
nodes, one GPU slot each), submitted through the SDK:

1. The gang runs one member per node, both ranks all-reduce over gloo, and the collected outputs
   (``/job/output`` of both members, under the attempt's prefix) record both ranks' results; the attempt is
   billed once, for both members' GPU-seconds; ``GET /v1/jobs/{id}`` shows both members succeeded.
2. The same with ``HOLD_S`` (the members meet at a barrier every half second): once both ranks have
   all-reduced, rank 1's agent is SIGKILLed. Rank 1's runtime gets SIGTERM (the agent's PDEATHSIG) and stops its
   container, so rank 0's next barrier fails and its program exits with an error; its agent holds that report
   (``gang_failure_hold_s``) while it heartbeats. The node API notices the silent member (``gang_silence_s`` =
   the stack's heartbeat, 12 s) and fails the gang blaming it; rank 0's agent gets 410 and reports nothing (had
   rank 0 still been running, the 410 would kill it; its container goes with its runtime). The gang is retried
   as a unit on a new epoch, off the dead node, and succeeds; the ledger holds one charged entry, for the new
   epoch, counting each of its members once (never the dead attempt's, never twice).

Why opt-in: its own stack (the session stack must keep its three agents), the ~700 MB torch image (built once
per machine, ~30 s; checked in ~2 s after that) and ~3 minutes on 2 shared cores. Run:
``GPUFLEET_E2E_GANG=1 pytest -n 0 tests/e2e/test_gang_allreduce_e2e.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from stack_helpers import HEARTBEAT_S, READY_TIMEOUT_S, REPO, RUNTIME_ENV, StackProcess, World, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e-gang"),
              pytest.mark.skipif(os.environ.get("GPUFLEET_E2E_GANG") != "1",
                                 reason="opt-in (its own stack, the torch image, ~3 min): GPUFLEET_E2E_GANG=1")]

EXAMPLES = REPO / "docs" / "examples"
HOLD_S = 30  # the members keep meeting at barriers this long after the all-reduce (the kill happens meanwhile)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from gpufleet.local import oci_image, torch_image
    from gpufleet.runtime.oci import Podman

    reason = oci_image.local_oci_unavailable() or torch_image.unavailable()
    if reason:
        pytest.skip(f"tenant containers or the torch image unavailable: {reason}")
    t0 = time.monotonic()
    torch_image.ensure_image(Podman(user=oci_image.local_oci_user()), app=torch_image.EXAMPLE_APP)
    print(f"\n[e2e] torch image ready in {time.monotonic() - t0:.1f}s")
    state = tmp_path_factory.mktemp("gang-stack")
    args = ["--port", "0", "--console-port", "0", "--device", "cpu", "--scheduler-interval", "2", "--agents", "3",
            "--heartbeat-seconds", str(HEARTBEAT_S)]
    for k, v in RUNTIME_ENV.items():
        args += ["--runtime-env", f"{k}={v}"]
    proc = StackProcess(state, args)
    manifest = proc.start(READY_TIMEOUT_S)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUFLEET_PROFILE", str(state / "profile.json"))
        mp.delenv("GPUFLEET_ENDPOINT", raising=False)
        from gpufleet.sdk import Client

        try:
            yield {"world": World(manifest), "client": Client(), "manifest": manifest, "proc": proc}
        finally:
            assert proc.stop() == 0, proc.tail()


def _spec(**env: str) -> dict:
    spec = json.loads((EXAMPLES / "gang_allreduce.json").read_text())
    if env:
        spec["workload"]["env"] = env
    return spec


def _members(world: World, job_id: str, epoch: int) -> list[str]:
    """The attempt's member nodes in rank order."""
    attempt = world.attempt(job_id, epoch) or {}
    return [str(m["node"]) for m in (attempt.get("placement") or {}).get("members") or []]


def _logs(world: World, job_id: str) -> bytes:
    s3, bucket = world.c("s3"), world.buckets["logs"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"jobs/{job_id}/").get("Contents", [])]
    return b"".join(s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys)


def _results(client, job_id: str, tmp_path: Path) -> list[dict]:
    out = client.output(job_id)
    assert out.kind == "files" and sorted(f.path for f in out.files) == ["rank0.json", "rank1.json"], out
    got = client.download_output(job_id, tmp_path, out)
    return [json.loads(got[f"rank{r}.json"].read_text()) for r in (0, 1)]


def _assert_all_reduced(results: list[dict], epoch: int) -> None:
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["world_size"] == 2 and r["contributed"] == rank + 1, r
        assert r["all_reduce_sum"] == 3.0 and r["gathered"] == [1.0, 2.0] and r["epoch"] == str(epoch), r


def _assert_billed_once_per_member(world: World, job_id: str, epoch: int, at_least_s: float = 0.0) -> dict:
    """One charged ledger entry, the given attempt's: its GPU-seconds are the sum of both members' reports (each
    counted once: ``gang_succeeded`` is 2), rounded up to whole seconds — no other epoch charged, no epoch twice."""
    attempt = world.attempt(job_id, epoch)
    assert int(attempt["gang_succeeded"]) == 2, attempt
    entries = world.ledger(job_id)
    charged = [e for e in entries if e.get("charged")]
    assert [int(e["epoch"]) for e in charged] == [epoch], entries
    assert len({(int(e["epoch"]), e["sk"]) for e in entries}) == len(entries), entries
    (entry,) = charged
    # billing rounds up to whole GPU-seconds (BillingPolicy.min_gpu_seconds, 1 s)
    assert 0 <= float(entry["gpu_seconds"]) - float(attempt["gang_gpu_seconds"]) < 1.0, (entry, attempt)
    assert float(entry["gpu_seconds"]) >= at_least_s, entry
    job = world.job(job_id)
    assert job["billing"]["charged"] is True and int(job["billing"]["epoch"]) == epoch
    return entry


def test_a_two_node_gang_all_reduces_across_its_members_and_records_both_ranks(stack, tmp_path):
    world, client = stack["world"], stack["client"]
    job = client.submit(_spec())
    done = client.wait(job.job_id, timeout=240)
    assert done.status.value == "SUCCEEDED", (done, world.describe_history(job.job_id))
    epoch = int(world.job(job.job_id)["current_epoch"])
    nodes = _members(world, job.job_id, epoch)
    assert len(nodes) == 2 and len(set(nodes)) == 2 and set(nodes) <= set(world.agents), nodes
    _assert_all_reduced(_results(client, job.job_id, tmp_path), epoch)
    logs = _logs(world, job.job_id)
    assert b"rank 0/2: all_reduce sum 3.0" in logs and b"rank 1/2: all_reduce sum 3.0" in logs
    wait_for(lambda: world.ledger(job.job_id), 30, 0.2, "the ledger entry")
    entry = _assert_billed_once_per_member(world, job.job_id, epoch)
    view = client.get(job.job_id)
    assert [(m["node"], m["rank"], m["state"]) for m in view.members] == [(n, r, "succeeded") for r, n in enumerate(nodes)]
    kinds = [e.type for e in client.events(job.job_id)]
    assert kinds.count("gang_started") == 1 and kinds.count("gang_ended") == 1, kinds
    print(f"\n[e2e] gang {job.job_id} on {nodes}: billed {entry['amount_usd']} USD for {entry['gpu_seconds']} GPU-s")


def test_killing_one_members_agent_ends_the_other_and_the_gang_is_retried_as_a_unit(stack, tmp_path):
    world, client, manifest = stack["world"], stack["client"], stack["manifest"]
    job = client.submit(_spec(HOLD_S=str(HOLD_S)))
    job_id = job.job_id
    wait_for(lambda: int((world.job(job_id) or {}).get("current_epoch", 0)) and _members(
        world, job_id, int(world.job(job_id)["current_epoch"])), 120, 0.5, "the gang's placement")
    first = int(world.job(job_id)["current_epoch"])
    rank0_node, victim = _members(world, job_id, first)
    wait_for(lambda: all(f"rank {r}/2: all_reduce sum 3.0".encode() in _logs(world, job_id) for r in (0, 1)), 180, 0.5,
             "both ranks' all-reduce (in the job's logs)")
    os.kill(world.agents[victim], signal.SIGKILL)  # mid-run: both members hold the process group for HOLD_S
    t_kill = time.monotonic()

    # the other member is ended (its barrier fails with its peer gone, or its agent kills it on the 410) and its
    # agent, told that the gang failed, reports nothing — well before the members' HOLD_S would have ended
    survivor_log = Path(next(a["log"] for a in manifest["agents"] if a["node_id"] == rank0_node))
    wait_for(lambda: "task gone while running; stopping the job" in survivor_log.read_text(), HOLD_S, 0.5,
             "the surviving member's agent told the gang failed")
    assert time.monotonic() - t_kill < HOLD_S
    held = "gang member failed; holding its report" in survivor_log.read_text()
    print(f"\n[e2e] survivor's own failure held and dropped: {held}")
    rank0 = f"gpufleet-{job_id}-e{first:04d}-r0"
    wait_for(lambda: not world.runtime_processes(job_id, root=world.agents[rank0_node]), 30, 0.5,
             "rank 0's runtime gone")
    from gpufleet.local import oci_image
    from gpufleet.runtime.oci import Podman

    podman = Podman(user=oci_image.local_oci_user())
    wait_for(lambda: podman.run("container", "exists", rank0, check=False).returncode != 0, 30, 0.5,
             "rank 0's container gone")

    done = client.wait(job_id, timeout=300)
    assert done.status.value == "SUCCEEDED", (done, world.describe_history(job_id))
    final = int(world.job(job_id)["current_epoch"])
    assert final > first
    failed = world.attempt(job_id, first)
    assert failed["gang_failed"]["node"] == victim and not int(failed.get("gang_succeeded", 0)), failed
    nodes = _members(world, job_id, final)
    assert len(set(nodes)) == 2 and victim not in nodes, (nodes, victim)
    _assert_all_reduced(_results(client, job_id, tmp_path), final)
    wait_for(lambda: [e for e in world.ledger(job_id) if e.get("charged")], 30, 0.2, "the ledger entry")
    entry = _assert_billed_once_per_member(world, job_id, final, at_least_s=2 * HOLD_S)
    events = client.events(job_id)
    ended = [e.detail for e in events if e.type == "gang_ended"]
    assert [(int(d["epoch"]), d["outcome"]) for d in ended] == [(first, "FAILED"), (final, "SUCCEEDED")], ended
    print(f"\n[e2e] gang {job_id}: epoch {first} on {[rank0_node, victim]} lost {victim}; epoch {final} on {nodes} "
          f"billed {entry['amount_usd']} USD for {entry['gpu_seconds']} GPU-s")
