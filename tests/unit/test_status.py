"""Property tests of the job status transition table."""

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.errors import InvalidTransition
from gpufleet.status import TERMINAL, TRANSITIONS, JobStatus, check_transition


def test_terminal_set_is_exactly_the_end_states():
    assert TERMINAL == {
        JobStatus.REJECTED, JobStatus.SUCCEEDED, JobStatus.FAILED,
        JobStatus.BLOCKED, JobStatus.QUARANTINED, JobStatus.CANCELLED, JobStatus.EXPIRED,
    }


def test_every_status_reachable_from_queued():
    seen = {JobStatus.QUEUED}
    todo = deque([JobStatus.QUEUED])
    while todo:
        for nxt in TRANSITIONS[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(JobStatus)


@given(st.lists(st.sampled_from(list(JobStatus)), min_size=1, max_size=30))
def test_no_walk_leaves_a_terminal_state(path):
    current = JobStatus.QUEUED
    for target in path:
        if current.can_move_to(target):
            check_transition(current, target)
            current = target
        else:
            with pytest.raises(InvalidTransition):
                check_transition(current, target)
    if current.is_terminal():
        assert all(not current.can_move_to(s) for s in JobStatus)


@given(st.sampled_from(sorted(TERMINAL)), st.sampled_from(list(JobStatus)))
def test_terminal_rejects_every_move(term, target):
    with pytest.raises(InvalidTransition):
        check_transition(term, target)
