"""The attempt routes' registration check: a found registration is trusted for ``ttl_s``, an absent one never."""

from __future__ import annotations

import pytest

from gpufleet.clock import FakeClock
from gpufleet.errors import NotAllowed
from gpufleet.nodeapi.liveness import Registration
from gpufleet.nodeapi.registered import RegisteredNodes
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.nodes import MemoryNodeStore
from gpufleet.tables import REGISTRATION_SK, node_pk


class CountingNodes(MemoryNodeStore):
    reads: int = 0

    def registration(self, node_id: str):
        self.reads += 1
        return super().registration(node_id)


def _world(ttl: float = 5.0) -> tuple[CountingNodes, FakeClock, RegisteredNodes]:
    nodes, clock = CountingNodes(MemoryDatabase()), FakeClock(1_780_000_000.0)
    return nodes, clock, RegisteredNodes(nodes, clock, ttl)


def test_a_found_registration_is_trusted_for_ttl_then_read_again():
    nodes, clock, check = _world()
    nodes.register(Registration(node_id="n1", pool="p"))
    check.check("n1")
    check.check("n1")
    clock.advance(4.9)
    check.check("n1")
    assert nodes.reads == 1
    nodes.db.delete("control", (node_pk("n1"), REGISTRATION_SK))  # an operator deregisters it
    check.check("n1")  # still within the bound: the one window deregistration leaves
    clock.advance(0.2)
    with pytest.raises(NotAllowed, match="not registered"):
        check.check("n1")
    assert nodes.reads == 2


def test_an_absent_registration_is_never_remembered():
    nodes, _clock, check = _world()
    for _ in range(3):
        with pytest.raises(NotAllowed):
            check.check("n2")
    assert nodes.reads == 3
    nodes.register(Registration(node_id="n2", pool="p"))
    check.check("n2")  # registered now: admitted on the next call


def test_ttl_zero_reads_on_every_call():
    nodes, _clock, check = _world(ttl=0)
    nodes.register(Registration(node_id="n1", pool="p"))
    for _ in range(3):
        check.check("n1")
    assert nodes.reads == 3
