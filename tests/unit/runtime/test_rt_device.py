"""Device choice for generation and the host copies that keep snapshots device-independent."""

from __future__ import annotations

import pytest
import torch

from gpufleet.envelope import ExitCode
from gpufleet.errors import ConfigError
from gpufleet.runtime import denoise
from gpufleet.runtime.device import resolve_device
from gpufleet.runtime.main import classify
from gpufleet.runtime.settings import RuntimeSettings


@pytest.mark.parametrize(("setting", "cuda", "want"), [
    ("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cpu", False, "cpu"),
    ("cuda", True, "cuda"), ("cuda:1", True, "cuda:1"),
])
def test_the_device_follows_the_setting_and_what_is_visible(setting, cuda, want):
    assert resolve_device(setting, cuda) == want


@pytest.mark.parametrize(("setting", "cuda"), [("cuda", False), ("cuda:0", False), ("gpu", True), ("cuda:x", True),
                                               ("", True)])
def test_an_impossible_or_unknown_device_is_a_config_error_and_a_system_failure(setting, cuda):
    with pytest.raises(ConfigError) as err:
        resolve_device(setting, cuda)
    assert classify(err.value) == ExitCode.SYSTEM_ERROR  # retried elsewhere, never run silently on the CPU


def test_the_setting_is_read_from_the_environment():
    assert RuntimeSettings.load(env={}).device == "auto"
    assert RuntimeSettings.load(env={"GPUFLEET_DEVICE": "cuda:0"}).device == "cuda:0"
    with pytest.raises(ConfigError):  # refused at start-up, before any work
        RuntimeSettings.load(env={"GPUFLEET_DEVICE": "gpu"})


def test_host_copies_share_no_storage_and_keep_nesting():
    a, b = torch.arange(4.0), torch.ones(2, 2)
    state = {"model_outputs": [a, None, (b, 3)], "step": 2, "sigmas": a}
    copied = denoise._host_copy(state)
    assert copied["step"] == 2 and copied["model_outputs"][1] is None and copied["model_outputs"][2][1] == 3
    assert isinstance(copied["model_outputs"][2], tuple)
    for orig, dup in ((a, copied["model_outputs"][0]), (b, copied["model_outputs"][2][0]), (a, copied["sigmas"])):
        assert torch.equal(orig, dup) and dup.device.type == "cpu" and dup.data_ptr() != orig.data_ptr()
    a.add_(1)  # the loop mutating its tensors must not change a snapshot already taken
    assert torch.equal(copied["sigmas"], torch.arange(4.0))


def test_moving_state_reaches_every_nested_tensor():
    state = [torch.zeros(2), (torch.ones(1), "x"), {"k": torch.ones(3)}]
    moved = denoise._to(state, "meta")  # a device with no storage: enough to see where each tensor went
    assert moved[0].device.type == moved[1][0].device.type == moved[2]["k"].device.type == "meta"
    assert moved[1][1] == "x"
    same = denoise._to(state, "cpu")
    assert same[0] is state[0]  # already there: no copy
