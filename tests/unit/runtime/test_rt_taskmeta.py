"""The cloud supervisor's view of the tenant container through the ECS task metadata endpoint (v4)."""

from __future__ import annotations

import pytest

from gpufleet.runtime.taskmeta import MetadataUnavailable, TenantWatch, container_state


def task(status: str | None, code: int | None = None) -> dict:
    containers = [
        {"Name": "supervisor", "KnownStatus": "RUNNING"},
        {"Name": "gate", "KnownStatus": "STOPPED", "ExitCode": 0},
    ]
    if status is not None:
        containers.append({"Name": "tenant", "KnownStatus": status, **({"ExitCode": code} if code is not None else {})})
    return {"TaskARN": "arn:aws:ecs:us-east-1:1:task/x", "Containers": containers}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_container_state_reads_the_named_container_only():
    assert container_state(task(None)) is None  # not listed yet: the gate has not released it
    running = container_state(task("RUNNING"))
    assert running.known_status == "RUNNING" and not running.stopped and running.exit_code is None
    assert container_state(task("STOPPED", 3)).exit_code == 3
    assert container_state(task(None), "gate").exit_code == 0


def test_the_watch_returns_the_tenants_exit_code_once_it_stopped():
    answers = iter([task(None), task("PENDING"), task("RUNNING"), task("STOPPED", 7)])
    clock = Clock()
    watch = TenantWatch(lambda: next(answers), poll_s=0.5, monotonic=clock.monotonic, sleep=clock.sleep)
    assert watch.wait() == 7 and clock.t == 1.5


def test_the_watch_ends_when_the_supervisor_stops_and_gives_up_on_a_silent_endpoint():
    clock = Clock()
    watch = TenantWatch(lambda: task("RUNNING"), poll_s=1, monotonic=clock.monotonic, sleep=clock.sleep)
    assert watch.wait(stop=lambda: clock.t >= 3) is None

    def broken() -> dict:
        raise OSError("connection refused")

    flaky = iter([OSError("blip"), task("STOPPED", 0)])

    def once_broken() -> dict:
        got = next(flaky)
        if isinstance(got, Exception):
            raise got
        return got

    clock = Clock()
    assert TenantWatch(once_broken, monotonic=clock.monotonic, sleep=clock.sleep).wait() == 0  # a blip is retried
    clock = Clock()
    with pytest.raises(MetadataUnavailable, match="unreadable"):
        TenantWatch(broken, poll_s=5, give_up_s=20, monotonic=clock.monotonic, sleep=clock.sleep).wait()
