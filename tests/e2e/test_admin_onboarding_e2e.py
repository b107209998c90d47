"""Onboarding through the administration CLI on the real embedded stack, and tenant isolation at the front door.

Nothing is seeded for these tenants: the stack's bootstrap operator (``<state>/profiles/operator.json``) onboards
them with ``gpufleet admin``; ``gpufleet dev --add-principal`` stands in for IAM (each user gets its own access
key, which the running gateway accepts, and its own profile). Bob (tenant acme) submits under a team quota he
sees with ``gpufleet quota``; the operator lowers it and Bob's next job waits with the scheduler's reason.
Carol (tenant beta) gets 404 for Bob's job on every route and neither lists the other's jobs, webhook endpoints,
webhook signing secrets or costs.
"""

from __future__ import annotations

import json

import pytest
from stack_helpers import wait_for

from gpufleet.cli.main import main
from gpufleet.errors import GpufleetError, NotFound
from gpufleet.sdk import Client

pytestmark = [pytest.mark.xdist_group("e2e-stack"), pytest.mark.slow]

SPEC = {"workload": {"kind": "video.generate", "prompt": "a lighthouse in fog", "frames": 5, "steps": 50},
        "pools": ["onprem-a"]}


def run(capsys, *argv: str) -> tuple[int, object]:
    code = main([*argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else out.err)


def test_onboard_through_the_admin_cli_then_quota_and_isolation(devstack, capsys):
    state = devstack["state"]
    op = ["--profile", str(state / "profiles" / "operator.json")]
    users = {}
    for name in ("bob", "carol", "eve"):
        code, out = run(capsys, "dev", "--state-dir", str(state), "--add-principal", name)
        assert code == 0, out
        users[name] = out
    for tenant, team, name in (("acme", "vision", "bob"), ("beta", "audio", "carol")):
        assert run(capsys, "admin", "tenant", "create", tenant, *op)[0] == 0
        assert run(capsys, "admin", "team", "create", tenant, team, *op)[0] == 0
        code, out = run(capsys, "admin", "user", "add", tenant, "--team", team, "--user", name,
                        "--arn", users[name]["arn"], *op)
        assert code == 0 and out["tenant"] == tenant, out
    assert run(capsys, "admin", "quota", "set", "acme/vision", "--guarantee", "*=1", *op)[0] == 0
    bob_p, carol_p = users["bob"]["profile"], users["carol"]["profile"]
    # a principal IAM knows but gpufleet does not, and a tenant's user on the administration API: refused
    assert run(capsys, "ls", "--profile", users["eve"]["profile"])[0] == 1
    assert run(capsys, "admin", "tenant", "list", "--profile", bob_p)[0] == 1

    code, quota = run(capsys, "quota", "--profile", bob_p)
    assert code == 0 and (quota["tenant"], quota["team"], quota["user"]) == ("acme", "vision", "bob")
    team_level = next(lv for lv in quota["levels"] if lv["level"] == "team")
    assert team_level["configured"] and team_level["limits"] == {"*": 1000}

    bob, carol = Client(profile=bob_p), Client(profile=carol_p)
    endpoint = bob.create_webhook_endpoint(devstack["receiver"].url, events=["completed"])
    first = bob.submit(SPEC)
    wait_for(lambda: bob.get(first.job_id).status.value not in ("QUEUED", "PENDING"), 120, 0.5, "bob's first job placed")
    assert run(capsys, "admin", "quota", "set", "acme/vision", "--guarantee", "*=0", *op)[0] == 0
    second = bob.submit(SPEC)

    def waiting_reason():
        job = run(capsys, "status", second.job_id, "--profile", bob_p)[1]
        return job.get("status") == "PENDING" and (job.get("scheduling") or {}).get("reason")

    reason = wait_for(waiting_reason, 60, 0.5, "bob's second job waiting on its quota")
    assert "quota" in reason, reason
    assert "quota.set" in [r["action"] for r in run(capsys, "admin", "audit", *op)[1]["items"]]

    theirs = carol.submit(SPEC)
    for job_id in (first.job_id, second.job_id):  # every route of another tenant's job is a 404
        for call in (carol.get, carol.events, carol.logs, carol.output, carol.deliveries, carol.cancel):
            with pytest.raises(NotFound):
                call(job_id)
    assert {j.job_id for j in carol.list().jobs} == {theirs.job_id}
    assert theirs.job_id not in {j.job_id for j in bob.list().jobs}
    with pytest.raises(NotFound):
        bob.get(theirs.job_id)
    # webhooks: Bob's endpoint is not Carol's to see or change, and each tenant signs with its own secret
    assert [e["id"] for e in bob.iter_webhook_endpoints()] == [endpoint["id"]]
    assert list(carol.iter_webhook_endpoints()) == []
    for call in (carol.webhook_endpoint, carol.delete_webhook_endpoint):
        with pytest.raises(NotFound):
            call(endpoint["id"])
    secrets = {c: {s["secret"] for s in c.webhook_secrets()["secrets"]} for c in (bob, carol)}
    assert secrets[bob] and secrets[carol] and not secrets[bob] & secrets[carol]
    bob.delete_webhook_endpoint(endpoint["id"])
    for client, job in ((bob, first), (bob, second), (carol, theirs)):
        client.cancel(job.job_id)
    # leave the shared stack as found: every job ended and its GPUs released before the next scenario
    for client, job in ((bob, first), (bob, second), (carol, theirs)):
        wait_for(lambda c=client, j=job: c.get(j.job_id).status.value == "CANCELLED", 120, 0.5,
                 f"{job.job_id} cancelled")
    # costs: each tenant's report holds its own attempts only (Carol's one job, once Bill recorded it), and
    # another tenant's report is refused
    def billed(client, n):  # the tenant's report once Bill recorded its n jobs (a charge or a waiver each)
        report = client.costs(by="tenant")
        total = report["total"]
        return report if total["charged_attempts"] + total["waived_attempts"] >= n else None

    theirs_report = wait_for(lambda: billed(carol, 1), 60, 0.5, "carol's job billed")
    assert [g["key"] for g in theirs_report["groups"]] == ["beta"]
    bob_report = wait_for(lambda: billed(bob, 2), 60, 0.5, "bob's jobs billed")
    assert [g["key"] for g in bob_report["groups"]] == ["acme"]
    with pytest.raises(GpufleetError):
        carol.costs(tenant="acme")


def test_an_operator_publishes_a_model_and_jobs_run_it_from_the_node_cache(devstack, capsys, tmp_path):
    """``gpufleet admin models publish`` with the operator's own credentials into the stack's models bucket, then
    registered in the model catalog through the stack's administration API (which read the manifest from its models
    root: the hash it registered is the one publish printed); a tenant's job naming that model runs on the on-prem
    agent, which fetches it into the node cache (a miss), and the
    next job finds it there (a hit, or resident in the warm worker). The model is wan-tiny's folder under a name of
    its own, so the runtime resolves it from the bucket, not from the built-in."""
    from gpufleet.models.tiny_wan import save_tiny_wan

    state = devstack["state"]
    op = ["--profile", str(state / "profiles" / "operator.json")]
    manifest = json.loads((state / "stack.json").read_text())
    root = manifest["published models"]  # the stack's banner names where to publish: its ModelsRoot
    assert root == manifest["aws"]["outputs"]["ModelsRoot"] and root in devstack["log"].read_text()
    folder = save_tiny_wan(tmp_path / "wan-published")
    code, out = run(capsys, "admin", "models", "publish", str(folder), "--name", "wan-published", "--root", root,
                    "--s3-endpoint", manifest["moto_endpoint"], *op)
    assert code == 0 and out["name"] == "wan-published", out
    registered = out["registered"]
    assert (registered["content_hash"], registered["source"]) == (out["content_hash"], "published"), out
    code, listed = run(capsys, "admin", "models", "list", "--root", root, "--s3-endpoint", manifest["moto_endpoint"],
                       *op)
    assert code == 0, listed
    row = next(r for r in listed if r["name"] == "wan-published")
    assert (row["state"], row["registered_hash"], row["published_hash"]) == (
        "registered", out["content_hash"], out["content_hash"]), row
    client = Client()
    spec = {"workload": {"kind": "video.generate", "prompt": "a paper boat on a pond", "model": "wan-published",
                         "frames": 5, "steps": 2, "width": 64, "height": 64}, "pools": ["onprem-a"]}
    caches = []
    for i in range(2):
        job = client.submit(spec, idempotency_key=f"published-{i}")
        done = wait_for(lambda j=job.job_id: (v := client.get(j)).status.value in ("SUCCEEDED", "FAILED") and v,
                        timeout=180)
        assert done.status.value == "SUCCEEDED", done
        caches.append(done.last_run["phases"]["model_cache"])
    assert caches[0] == "miss" and caches[1] in ("hit", "resident"), caches
