"""Start a list of components in order and stop them in reverse, whatever fails.

Contract: :meth:`Supervisor.start` starts each component; if one fails, those already started
are stopped (reverse order) and the error is re-raised. :meth:`Supervisor.stop` stops every
started component once, in reverse order, collecting (not hiding) failures: they are returned
as ``(name, error)`` pairs so the caller can report them.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("gpufleet.devstack")


class Component(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def describe(self) -> dict[str, str]: ...


class Supervisor:
    def __init__(self, components: list[Component]) -> None:
        self.components = components
        self.started: list[Component] = []

    def start(self, on_started=None) -> None:
        for component in self.components:
            log.info("starting %s", component.name)
            try:
                component.start()
            except BaseException:
                self.stop()
                raise
            self.started.append(component)
            if on_started is not None:
                on_started(component)

    def stop(self) -> list[tuple[str, BaseException]]:
        failures: list[tuple[str, BaseException]] = []
        while self.started:
            component = self.started.pop()
            log.info("stopping %s", component.name)
            try:
                component.stop()
            except Exception as err:  # noqa: BLE001 - reported to the caller, never swallowed
                log.error("stopping %s failed: %s", component.name, err)
                failures.append((component.name, err))
        return failures
