"""GPU-busy sampling (gpufleet.runtime.gpuutil) with a fake NVML module, and the paths that measure nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpufleet.runtime.gpuutil import Busy, NotMeasured, NvmlSampler, open_sampler


class NVMLError(Exception):
    pass


class FakeNvml:
    """The pynvml calls the sampler makes: 3 GPUs (indices 0-2, UUIDs GPU-a/b/c), utilisation per read."""

    NVMLError = NVMLError

    def __init__(self, readings: dict[int, list[float]], init_error: bool = False) -> None:
        self.readings = readings
        self.init_error = init_error
        self.uuids = {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2}

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.uuids[uuid]

    def nvmlDeviceGetUtilizationRates(self, h):
        values = self.readings[h]
        if not values:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=values.pop(0), memory=0)


def test_the_busy_share_is_the_mean_over_samples_and_the_attempts_gpus_only():
    nvml = FakeNvml({0: [100, 100], 1: [50, 30], 2: [0, 0]})
    sampler = open_sampler("cuda", {"CUDA_VISIBLE_DEVICES": "0,GPU-b"}, nvml=nvml)
    assert isinstance(sampler, NvmlSampler) and sampler.handles == [0, 1]
    sampler.sample()
    busy = sampler.stop()  # takes the last sample
    assert busy == Busy(share=(100 + 50 + 100 + 30) / 400, samples=4)
    assert busy.as_phases() == {"gpu_busy": 0.7, "gpu_busy_samples": 4}
    assert nvml.readings[2] == [0, 0]  # GPU 2 is another job's: never read


def test_failed_reads_are_skipped_and_all_failed_is_not_measured():
    nvml = FakeNvml({0: [80], 1: [], 2: []})
    sampler = open_sampler("cuda:0", {}, nvml=nvml)  # unset CUDA_VISIBLE_DEVICES: every GPU NVML lists
    sampler.sample()
    assert (sampler.samples, sampler.failures) == (1, 2)
    assert sampler.stop() == Busy(0.8, 1)
    dead = open_sampler("cuda", {"CUDA_VISIBLE_DEVICES": "1"}, nvml=FakeNvml({0: [], 1: [], 2: []}))
    assert dead.stop() is None  # measured nothing: None, never 0


@pytest.mark.parametrize(("device", "env", "nvml", "why"), [
    ("cpu", {}, FakeNvml({}), "runs on cpu"),
    ("cuda", {}, FakeNvml({}, init_error=True), "Driver Not Loaded"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "7"}, FakeNvml({}), "none of the attempt's GPUs"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": ""}, FakeNvml({}), "none of the attempt's GPUs"),
])
def test_without_nvml_or_a_gpu_nothing_is_measured(device, env, nvml, why):
    sampler = open_sampler(device, env, nvml=nvml)
    assert isinstance(sampler, NotMeasured) and why in sampler.reason
    sampler.start()
    assert sampler.stop() is None


def test_this_hosts_real_path_on_cpu_measures_nothing():
    """The import path without an injected module: on a CPU device NVML is never consulted."""
    assert open_sampler("cpu").stop() is None


def test_the_sampling_thread_starts_and_stops():
    nvml = FakeNvml({0: [60] * 1000, 1: [60] * 1000, 2: [60] * 1000})
    sampler = open_sampler("cuda", {"CUDA_VISIBLE_DEVICES": "2"}, nvml=nvml, interval_s=0.001)
    sampler.start()
    busy = sampler.stop()
    # a mean over many samples: equal to 0.6 up to float summation (0.5999… under load, more samples)
    assert busy is not None and busy.share == pytest.approx(0.6) and busy.samples >= 1 and sampler._thread is None
