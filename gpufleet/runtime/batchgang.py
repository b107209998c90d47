"""A cloud gang's main node ends the gang when another member failed (AWS Batch does nothing about a child node).

Contract: on a Batch multi-node parallel job, the job ends only when its main node exits, and a child node that
fails changes nothing by itself. Each node's runtime records its member state on the attempt item
(:func:`gpufleet.gang.batch_member_record`); :class:`GangWatch` runs on the main node (rank 0) beside its stage
and, every ``interval_s``, reads the attempt item: the first other member whose recorded state is a failure
(anything but ``running``, ``succeeded`` or not yet recorded) stops the stage through :class:`RunControl` with
that member's exit code (its state names one: ``user_error`` → USER_ERROR; unknown → SYSTEM_ERROR), so the main
node exits, Batch ends every node, and the attempt fails as that member did — retried as a unit (a new epoch)
when that class retries. A failed read is logged and tried again at the next interval. A member that vanishes
without recording (its instance lost) is left to the collective it breaks, which fails on the main node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.envelope import ExitCode
from gpufleet.gang import failed_member
from gpufleet.runtime.control import RunControl

log = logging.getLogger("gpufleet.runtime.batchgang")


class GangWatch:
    """Watches the other members' recorded states from the main node (module contract)."""

    def __init__(self, read_attempt: Callable[[], Mapping[str, Any]], world_size: int, control: RunControl,
                 interval_s: float) -> None:
        self.read_attempt = read_attempt
        self.world_size = world_size
        self.control = control
        self.interval_s = interval_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One look; True when it stopped the stage."""
        try:
            attempt = self.read_attempt()
        except Exception as err:  # noqa: BLE001 - throttling, a network fault: look again next time
            log.warning("could not read the gang's member states: %s", err)
            return False
        failed = failed_member(attempt, self.world_size, own_rank=0)
        if failed is None:
            return False
        rank, state = failed
        code = ExitCode.__members__.get(state.upper(), ExitCode.SYSTEM_ERROR)
        self.control.request(code, f"gang member {rank} ended {state}")
        return True

    def _run(self) -> None:
        while not self._done.wait(self.interval_s) and self.control.stop_reason() is None:
            if self.check():
                return

    def start(self) -> GangWatch:
        self._thread = threading.Thread(target=self._run, name="gang-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
