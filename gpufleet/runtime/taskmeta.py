"""The ECS task metadata endpoint (v4) as a cloud attempt's supervisor reads it: has the tenant container exited?

On Batch a cloud container job is one multi-container ECS task (:mod:`gpufleet.batchdef`): the supervisor does not
start the tenant (ECS does, once the ``gate`` container saw :data:`gpufleet.batchdef.READY_FILE`), so it learns
of the tenant's end from ``${ECS_CONTAINER_METADATA_URI_V4}/task``, whose ``Containers`` list each container's
``Name``, ``KnownStatus`` and, once stopped, ``ExitCode``. The endpoint answers every container of the task and
carries no credentials.

Contract:
- :func:`container_state` reads one container's :class:`ContainerState` from a ``/task`` document; ``None`` when
  the task does not list it (yet).
- :class:`TenantWatch` polls ``fetch()`` (the parsed ``/task`` document; the default reads the endpoint with
  urllib) every ``poll_s`` until the tenant is ``STOPPED`` and returns its exit code (``None``: it stopped
  without one, e.g. it never started), or until ``stop()`` is true (returns ``None`` at once: the supervisor is
  stopping, cancel or fencing, and the task ends with it since the supervisor is the essential container). A
  failed read is retried; reads failing for longer than ``give_up_s`` raise :class:`MetadataUnavailable`.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STOPPED = "STOPPED"


class MetadataUnavailable(RuntimeError):
    """The task metadata endpoint did not answer for longer than the watch allows."""


@dataclass(frozen=True)
class ContainerState:
    name: str
    known_status: str
    exit_code: int | None = None

    @property
    def stopped(self) -> bool:
        return self.known_status == STOPPED


def container_state(task: dict[str, Any], name: str = "tenant") -> ContainerState | None:
    """The state of container ``name`` in a ``/task`` document, or None when it is not listed."""
    for c in task.get("Containers") or []:
        if c.get("Name") == name:
            code = c.get("ExitCode")
            return ContainerState(name, str(c.get("KnownStatus") or ""), None if code is None else int(code))
    return None


def endpoint_fetch(base: str | None = None, timeout_s: float = 2.0) -> Callable[[], dict[str, Any]]:
    """A ``fetch`` reading ``<base>/task`` (``base``: ``ECS_CONTAINER_METADATA_URI_V4`` by default)."""
    root = base or os.environ.get("ECS_CONTAINER_METADATA_URI_V4", "")
    if not root:
        raise MetadataUnavailable("ECS_CONTAINER_METADATA_URI_V4 is not set (not an ECS task)")

    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(f"{root.rstrip('/')}/task", timeout=timeout_s) as resp:  # noqa: S310 - ECS's
            return json.loads(resp.read())

    return fetch


@dataclass
class TenantWatch:
    fetch: Callable[[], dict[str, Any]]
    poll_s: float = 1.0
    give_up_s: float = 60.0
    name: str = "tenant"
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def wait(self, stop: Callable[[], bool] = lambda: False) -> int | None:
        """The tenant's exit code once it stopped; None when it stopped without one or ``stop()`` came first."""
        failing_since: float | None = None
        while not stop():
            try:
                state = container_state(self.fetch(), self.name)
                failing_since = None
            except (OSError, ValueError) as err:
                now = self.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self.give_up_s:
                    raise MetadataUnavailable(
                        f"task metadata unreadable for {now - failing_since:.0f} s: {err}"
                    ) from err
                state = None
            if state is not None and state.stopped:
                return state.exit_code
            self.sleep(self.poll_s)
        return None
