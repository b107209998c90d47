"""The cloud supervisor's token, session name and attempt check (gpufleet.nodeapi.supervisor, pure)."""

from __future__ import annotations

import pytest

from gpufleet.errors import NotAllowed, StaleEpoch
from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.identity import agent_session_arn, caller_of


def test_a_minted_token_matches_its_hash_only():
    token, digest = supervisor.mint()
    other, _ = supervisor.mint()
    assert token != other and len(token) >= 43 and digest == supervisor.token_sha256(token)
    assert supervisor.token_matches(token, digest)
    assert not supervisor.token_matches(other, digest)
    assert not supervisor.token_matches(token, None) and not supervisor.token_matches("", digest)
    assert not supervisor.claimable({supervisor.TOKEN_ATTR: digest, supervisor.CLAIMED_ATTR: 1.0}, token)
    assert supervisor.claimable({supervisor.TOKEN_ATTR: digest}, token) and not supervisor.claimable(None, token)


def test_the_session_name_binds_job_and_epoch_and_is_never_a_node():
    name = supervisor.session_name("job_01m8nmrydh0vmje86g7ncnjh9j", 12)
    assert name == "sup-e12-job_01m8nmrydh0vmje86g7ncnjh9j" and len(name) <= 64
    assert supervisor.principal(name) == "sup:12:job_01m8nmrydh0vmje86g7ncnjh9j"
    assert supervisor.bound_attempt(supervisor.principal(name)) == ("job_01m8nmrydh0vmje86g7ncnjh9j", 12)
    assert supervisor.principal("node-a") is None and supervisor.bound_attempt("node-a") is None
    with pytest.raises(ValueError):
        supervisor.session_name("j" * 60, 1)  # over STS's 64 characters


def test_only_the_supervisor_role_makes_a_supervisor_principal():
    arn = f"arn:aws:sts::123456789012:assumed-role/sup-role/{supervisor.session_name('job-1', 2)}"
    assert caller_of(arn, ["agent"], ["sup-role"]) == "sup:2:job-1"
    # an agent session of that name is a node of that name, never the supervisor principal
    posing = caller_of(arn.replace("sup-role", "agent"), ["agent"], ["sup-role"])
    assert posing == "sup-e2-job-1" and supervisor.bound_attempt(posing) is None
    with pytest.raises(NotAllowed):
        caller_of(arn.replace("sup-e2-job-1", "node-a"), ["agent"], ["sup-role"])
    assert caller_of(agent_session_arn("123456789012", "agent", "node-a"), ["agent"], ["sup-role"]) == "node-a"


def test_check_supervisor_allows_the_bound_current_attempt_only():
    me = "sup:2:job-1"
    supervisor.check_supervisor(me, "job-1", 2, current_epoch=2, attempt_exists=True)
    for job, epoch, exists in (("job-2", 2, True), ("job-1", 1, True), ("job-1", 2, False)):
        with pytest.raises(NotAllowed):
            supervisor.check_supervisor(me, job, epoch, current_epoch=2, attempt_exists=exists)
    with pytest.raises(StaleEpoch):
        supervisor.check_supervisor(me, "job-1", 2, current_epoch=3, attempt_exists=True)
    with pytest.raises(NotAllowed):
        supervisor.check_supervisor("node-a", "job-1", 2, current_epoch=2, attempt_exists=True)
