"""The pure decisions of the node API: assignment and epoch, caller identity, pointer keys, node liveness."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.errors import NotAllowed, StaleEpoch, ValidationFailed
from gpufleet.nodeapi.assignment import attempt_nodes, check_assignment, checked_key
from gpufleet.nodeapi.identity import agent_session_arn, node_of
from gpufleet.nodeapi.liveness import LivenessReport, Registration, node_item
from gpufleet.nodeapi.scope import MAX_POLICY_CHARS, session_policy

nodes = st.sampled_from(["node-a", "node-b", "node-c"])


@given(node=nodes, owners=st.frozensets(nodes), epoch=st.integers(0, 50), current=st.integers(0, 50))
def test_allowed_exactly_when_the_node_owns_the_attempt_and_the_epoch_is_current(node, owners, epoch, current):
    try:
        check_assignment(node, epoch, current_epoch=current, nodes=owners)
    except NotAllowed:
        assert node not in owners
    except StaleEpoch as err:
        assert node in owners and epoch != current and err.extra["current_epoch"] == current
    else:
        assert node in owners and epoch == current


def test_ownership_is_decided_before_the_epoch():
    with pytest.raises(NotAllowed):  # another node's attempt at an old epoch: 403, not 409
        check_assignment("node-b", 1, current_epoch=2, nodes={"node-a"})
    with pytest.raises(NotAllowed):
        check_assignment("node-a", 1, current_epoch=1, nodes=None)  # no attempt item
    with pytest.raises(NotAllowed):
        check_assignment("", 1, current_epoch=1, nodes={""})


def test_attempt_nodes_include_gang_members():
    placement = {"epoch": 3, "node": "node-a", "queue_url": "q",
                 "members": [{"node": "node-a", "queue_url": "q"}, {"node": "node-b", "queue_url": "q2"}]}
    assert attempt_nodes({"placement": placement}) == {"node-a", "node-b"}
    assert attempt_nodes({"placement": {"epoch": 1, "target": "cloud", "job_queue": "x"}}) == frozenset()
    assert attempt_nodes(None) is None


@pytest.mark.parametrize("arn, node", [
    (agent_session_arn("123456789012", "gpufleet-agent", "node-7"), "node-7"),
    ("arn:aws-us-gov:sts::123456789012:assumed-role/gpufleet-agent/n1", "n1"),
])
def test_node_of_an_agent_session(arn, node):
    assert node_of(arn, {"gpufleet-agent"}) == node


@pytest.mark.parametrize("arn", [
    None, "", "arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:role/gpufleet-agent",
    "arn:aws:sts::123456789012:assumed-role/other-role/node-7",
    "arn:aws:sts::123456789012:assumed-role/gpufleet-agent/node-7-dlq",
    "arn:aws:sts::123456789012:assumed-role/gpufleet-agent/Node_7",
])
def test_anything_else_is_not_a_node(arn):
    with pytest.raises(NotAllowed):
        node_of(arn, {"gpufleet-agent"})


@pytest.mark.parametrize("key", ["jobs/j2/out.bin", "jobs/j1", "jobs/j1/", "jobs/j1/../j2/x", "jobs/j1//x",
                                 "other/j1/x", 7])
def test_pointer_keys_stay_in_the_jobs_prefix(key):
    with pytest.raises(ValidationFailed):
        checked_key("j1", key, "key")
    assert checked_key("j1", "jobs/j1/checkpoints/000001-e0001.ckpt", "key")
    assert checked_key("j1", "jobs/j1/output/", "key")  # a container job's output prefix


REG = Registration(node_id="node-a", pool="onprem-a", site="eu-west", labels={"site": "us-east", "rack": "r1"},
                   gpu_type="A100", gpus=2, gpu_memory_gb=80, cpu_milli=8000, memory_mib=1024, queue_url="q")


@given(free=st.dictionaries(st.integers(-5, 10), st.integers(-10**6, 10**6)), cpu=st.integers(0, 10**7),
       mem=st.integers(0, 10**7), ttl=st.integers(0, 10**7), draining=st.booleans())
def test_a_report_never_leaves_the_registration(free, cpu, mem, ttl, draining):
    report = LivenessReport(free_milli=free, cpu_milli_free=cpu, memory_mib_free=mem, ttl_s=ttl, draining=draining)
    item = node_item(REG, report, now=1000.0, max_ttl_s=60)
    assert (item["pool"], item["gpu_type"], item["queue_url"]) == ("onprem-a", "A100", "q")
    assert item["labels"] == {"site": "eu-west", "rack": "r1"}  # the operator's site wins over labels
    assert [g["index"] for g in item["gpus"]] == [0, 1]
    assert all(0 <= g["milli_free"] <= (0 if draining else 1000) for g in item["gpus"])
    assert item["cpu_milli_free"] <= 8000 and item["memory_mib_free"] <= 1024
    assert 1000 <= item["expires_at"] <= 1060


def test_a_report_may_not_name_a_pool():
    with pytest.raises(ValueError):
        LivenessReport.model_validate({"pool": "onprem-b"})
    with pytest.raises(ValueError):
        Registration(node_id="node-x-dlq", pool="p")


def test_session_policy_names_only_the_jobs_prefixes_and_inputs():
    policy = session_policy("j1", checkpoints="ck", outputs="out", logs="lg",
                            inputs=["s3://out/tenants/t/a.bin", "s3://ext/data/b.bin?versionId=3"])
    text = str(policy)
    assert "jobs/j1/*" in text and "jobs/*" not in text.replace("jobs/j1/*", "")
    reads = policy["Statement"][1]["Resource"]
    assert "arn:aws:s3:::out/tenants/t/a.bin" in reads and "arn:aws:s3:::ext/data/b.bin" in reads
    assert policy["Statement"][2]["Resource"] == ["arn:aws:s3:::ck"]  # listing only the checkpoints bucket
    assert policy["Statement"][2]["Condition"] == {"StringLike": {"s3:prefix": ["jobs/j1/*"]}}
    many = session_policy("j1", checkpoints="ck", outputs="out", logs="lg",
                          inputs=[f"s3://out/tenants/t/in/{i:03d}.bin" for i in range(64)])
    assert len(json.dumps(many, separators=(",", ":"))) <= MAX_POLICY_CHARS
    collapsed = [r for r in many["Statement"][1]["Resource"] if "tenants" in r]
    assert len(collapsed) == 1 and collapsed[0].startswith("arn:aws:s3:::out/tenants/t/in/") and collapsed[0][-1] == "*"
