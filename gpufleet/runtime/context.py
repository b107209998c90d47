"""What a stage needs, built once by the entrypoint and injected (tests build it directly)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpufleet.envelope import Envelope
from gpufleet.runtime.control import RunControl
from gpufleet.runtime.reporter import Reporter
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.jobitem import JobItem
from gpufleet.store.objectstore import ObjectStore


@dataclass
class StageContext:
    envelope: Envelope
    settings: RuntimeSettings
    objects: ObjectStore
    job: JobItem
    control: RunControl
    reporter: Reporter
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("gpufleet.runtime"))
    result: dict = field(default_factory=dict)  # stage output, printed as the final JSON line
