"""How busy an attempt's GPUs were while its compute loop ran, sampled through NVML; never guessed.

Contract:
- :func:`open_sampler` returns a :class:`UtilSampler`: an :class:`NvmlSampler` when the loop runs on
  ``cuda`` and NVML (``pynvml``, from the ``nvidia-ml-py`` package) initialises and names at least one of
  the attempt's GPUs; else a :class:`NotMeasured` saying why (a CPU device, no ``pynvml``, no driver).
  The attempt's GPUs are those ``CUDA_VISIBLE_DEVICES`` names: ``GPU-…`` UUIDs, or indices, which are
  NVML's own under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (what the on-prem agent sets); unset, every GPU
  NVML lists (a Batch container sees only its own).
- ``start()`` samples on a daemon thread every ``interval_s``; ``stop()`` takes one last sample, ends the
  thread and returns a :class:`Busy`: ``share`` is the mean, over the samples and the GPUs, of NVML's
  ``utilization.gpu`` (the percentage of its last sample period, 1/6 s to 1 s by product, in which a
  kernel ran), in ``[0, 1]``; ``samples`` how many reads went into it. ``None`` from
  :meth:`UtilSampler.stop` means *not measured* (no NVML, a CPU run, every read failed): callers record
  nothing then, never a made-up number. A failed read is skipped and logged once.
- ``sample()`` takes one sample now (the thread's body; tests call it directly with a fake module).
- NVML measures the device, not the process: a GPU shared with another job (fractional placement)
  reports both jobs' kernels.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("gpufleet.runtime.gpuutil")

#: seconds between samples (NVML's own sample period is 1/6 s to 1 s)
INTERVAL_S = 0.5


@dataclass(frozen=True)
class Busy:
    share: float
    samples: int

    def as_phases(self) -> dict[str, Any]:
        """The phase details (:mod:`gpufleet.phases`): ``gpu_busy`` and ``gpu_busy_samples``."""
        return {"gpu_busy": round(self.share, 4), "gpu_busy_samples": self.samples}


class UtilSampler(Protocol):
    def start(self) -> None: ...

    def stop(self) -> Busy | None: ...


class NotMeasured:
    """No measurement is possible here; ``reason`` says why. ``stop`` returns None."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        return None

    def stop(self) -> Busy | None:
        return None


class NvmlSampler:
    """Samples ``utilization.gpu`` of ``handles`` through ``nvml`` (an initialised ``pynvml``-like module)."""

    def __init__(self, nvml: Any, handles: list[Any], interval_s: float = INTERVAL_S) -> None:
        self.nvml = nvml
        self.handles = handles
        self.interval_s = interval_s
        self.total = 0.0  # sum of shares read
        self.samples = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Read every GPU's utilisation once; a failed read is skipped (logged the first time)."""
        for h in self.handles:
            try:
                pct = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception as err:  # noqa: BLE001 - pynvml.NVMLError and driver faults: skip the read
                self.failures += 1
                if self.failures == 1:
                    log.warning("NVML utilisation read failed: %s", err)
                continue
            self.total += min(100.0, max(0.0, pct)) / 100.0
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpu-util", daemon=True)
            self._thread.start()

    def stop(self) -> Busy | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.sample()
        return Busy(self.total / self.samples, self.samples) if self.samples else None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _handles(nvml: Any, visible: str | None) -> list[Any]:
    count = int(nvml.nvmlDeviceGetCount())
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    out = []
    for name in (v.strip() for v in visible.split(",") if v.strip()):
        if name.startswith(("GPU-", "MIG-")):
            out.append(nvml.nvmlDeviceGetHandleByUUID(name))
        elif name.isdigit() and int(name) < count:
            out.append(nvml.nvmlDeviceGetHandleByIndex(int(name)))
    return out


def _import_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def open_sampler(device: str, env: Mapping[str, str] | None = None, nvml: Any | None = None,
                 interval_s: float = INTERVAL_S) -> UtilSampler:
    """The sampler for a loop on ``device`` (``cuda``/``cuda:N``/``cpu``; module contract). ``env``: the
    process environment (``CUDA_VISIBLE_DEVICES``); ``nvml``: a module to use instead of ``pynvml``."""
    if not device.startswith("cuda"):
        return NotMeasured(f"the loop runs on {device}")
    lib = nvml if nvml is not None else _import_nvml()
    if lib is None:
        return NotMeasured("pynvml (nvidia-ml-py) is not installed")
    env = os.environ if env is None else env
    try:
        lib.nvmlInit()
        handles = _handles(lib, env.get("CUDA_VISIBLE_DEVICES"))
    except Exception as err:  # noqa: BLE001 - pynvml.NVMLError: no driver, no library, no device
        return NotMeasured(f"NVML unavailable: {_text(err)}")
    if not handles:
        return NotMeasured("NVML lists none of the attempt's GPUs")
    return NvmlSampler(lib, handles, interval_s)
