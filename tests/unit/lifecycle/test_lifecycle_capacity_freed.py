"""Releasing an attempt wakes the scheduler (``CapacityFreed``) only when this call gave GPUs back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpufleet.errors import NotFound
from gpufleet.lifecycle import steps
from gpufleet.store.fakes.workflow import MemoryEventBus


def deps(release, bus) -> SimpleNamespace:
    return SimpleNamespace(release=release, events=bus)


def test_a_release_that_freed_the_attempt_puts_capacity_freed():
    bus = MemoryEventBus()
    steps._release(deps(lambda j, e: True, bus), "job-1", 3)
    assert bus.sent == [("CapacityFreed", {"job_id": "job-1", "epoch": 3})]


@pytest.mark.parametrize("release", [lambda j, e: False, lambda j, e: None])
def test_an_attempt_already_given_back_wakes_nobody(release):
    bus = MemoryEventBus()
    steps._release(deps(release, bus), "job-1", 3)
    assert bus.sent == []


def test_an_epoch_never_placed_and_epoch_zero_put_nothing():
    bus, calls = MemoryEventBus(), []

    def missing(job_id, epoch):
        calls.append(epoch)
        raise NotFound("no attempt")

    steps._release(deps(missing, bus), "job-1", 2)
    steps._release(deps(missing, bus), "job-1", 0)
    assert calls == [2] and bus.sent == []


def test_a_bus_that_refuses_does_not_fail_the_step():
    steps._release(
        deps(lambda j, e: True, MemoryEventBus(refusing=True)), "job-1", 1
    )  # logged; the timer's pass is the backstop
    steps._release(deps(lambda j, e: True, None), "job-1", 1)  # no bus configured


def test_a_release_told_not_to_announce_stays_quiet():
    bus = MemoryEventBus()
    steps._release(deps(lambda j, e: True, bus), "job-1", 3, announce=False)
    assert bus.sent == []
