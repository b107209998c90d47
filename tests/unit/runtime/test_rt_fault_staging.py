"""The test faults GPUFLEET_FAULT_STAGING_DELAY_S and GPUFLEET_FAULT_STEP_DELAY_S: refused outside dev_mode; in
dev_mode the first lengthens staging, marked as the ``staging`` phase (fake clock, no sleep, no torch run); the
second's effect is what keeps the agent batch test's cancelled member mid-run."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from gpufleet.errors import ConfigError
from gpufleet.phases import PhaseRecorder, durations
from gpufleet.runtime.generate import stage_inputs
from gpufleet.runtime.settings import RuntimeSettings


def test_the_fault_is_refused_outside_a_development_runtime():
    with pytest.raises(ConfigError, match="dev_mode"):
        RuntimeSettings.load({"GPUFLEET_FAULT_STAGING_DELAY_S": "3"})
    with pytest.raises(ValidationError):
        RuntimeSettings(fault_staging_delay_s=3)
    dev = RuntimeSettings.load({"GPUFLEET_FAULT_STAGING_DELAY_S": "3", "GPUFLEET_DEV_MODE": "1"})
    assert dev.fault_staging_delay_s == 3
    assert RuntimeSettings().fault_staging_delay_s == 0


def test_the_step_delay_fault_is_refused_outside_a_development_runtime():
    with pytest.raises(ConfigError, match="fault_step_delay_s.*dev_mode"):
        RuntimeSettings.load({"GPUFLEET_FAULT_STEP_DELAY_S": "0.01"})
    dev = RuntimeSettings.load({"GPUFLEET_FAULT_STEP_DELAY_S": "0.01", "GPUFLEET_DEV_MODE": "1"})
    assert dev.fault_step_delay_s == 0.01
    assert RuntimeSettings().fault_step_delay_s == 0


def _ctx(settings: RuntimeSettings) -> SimpleNamespace:
    return SimpleNamespace(settings=settings, envelope=SimpleNamespace(job_id="j"), log=logging.getLogger("t"),
                           objects=None, job=None)


def test_in_dev_mode_staging_takes_the_delay_and_is_marked():
    t = [100.0]

    def sleep(s):
        t[0] += s

    phases = PhaseRecorder(lambda: t[0])
    phases.mark("started")
    no_inputs = SimpleNamespace(data=SimpleNamespace(inputs=[]))
    stage_inputs(_ctx(RuntimeSettings(fault_staging_delay_s=3, dev_mode=True)), no_inputs, phases, sleep=sleep)
    assert durations(phases.record) == {"staging": 3.0}
    plain = PhaseRecorder(lambda: t[0])
    plain.mark("started")
    stage_inputs(_ctx(RuntimeSettings()), no_inputs, plain, sleep=sleep)
    assert "inputs_staged" not in plain.record  # no inputs, no fault: no staging phase
