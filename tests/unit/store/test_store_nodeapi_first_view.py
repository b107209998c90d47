"""The runtime's first check of its job on a node goes out beside the credentials' vending (NodeApiJobItem)."""

from __future__ import annotations

import threading

import pytest

from gpufleet.errors import StaleEpoch
from gpufleet.store.nodeapi import NodeApiJobItem


class Api:
    """The node API client's ``attempt`` as the adapter calls it; ``gate`` holds the view calls until set."""

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()

    def attempt(self, job_id: str, epoch: int, op: str, body=None):
        self.calls.append((op, threading.current_thread().name))
        if op == "view":
            assert self.gate.wait(5)
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return {}


def test_the_prefetched_view_answers_the_first_check_and_later_checks_ask_again():
    api = Api([{"current_epoch": 3, "n": 1}, {"current_epoch": 3, "n": 2}])
    item = NodeApiJobItem(api, "job_1", 3).prefetch_view()
    api.attempt("job_1", 3, "credentials")  # the vending goes on while the view is held
    assert api.calls[-1][0] == "credentials"
    api.gate.set()
    assert item.check_current() == {"current_epoch": 3, "n": 1}
    assert sorted(op for op, _ in api.calls) == ["credentials", "view"]
    assert [name for op, name in api.calls if op == "view"] == ["first-view"]  # not on the caller's thread
    assert item.check_current() == {"current_epoch": 3, "n": 2}  # a fresh round trip
    assert [op for op, _ in api.calls].count("view") == 2


def test_a_stale_epoch_seen_by_the_prefetched_view_is_raised_by_the_check():
    api = Api([StaleEpoch("epoch 3 is stale", current_epoch=4)])
    item = NodeApiJobItem(api, "job_1", 3).prefetch_view()
    api.gate.set()
    with pytest.raises(StaleEpoch):
        item.check_current()


def test_without_a_prefetch_the_check_is_its_own_call():
    api = Api([{"current_epoch": 1}])
    api.gate.set()
    assert NodeApiJobItem(api, "job_1", 1).check_current() == {"current_epoch": 1}
    assert [op for op, _ in api.calls] == ["view"]
