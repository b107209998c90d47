"""Which torch device the generate stage runs on (pure logic; the caller asks torch what it has).

Contract: ``resolve_device(setting, cuda_available)``
- ``"auto"`` (the default): ``"cuda"`` when a CUDA device is visible, else ``"cpu"``;
- ``"cpu"``: always the CPU (tests, the demo, CPU-only nodes);
- ``"cuda"`` or ``"cuda:N"``: that device, and :class:`gpufleet.errors.ConfigError` when no
  CUDA device is visible (a node that should have a GPU and has none is a system failure,
  so the attempt is retried elsewhere rather than silently running on the CPU);
- anything else: :class:`gpufleet.errors.ConfigError`.
"""

from __future__ import annotations

import re

from gpufleet.errors import ConfigError

_CUDA = re.compile(r"cuda(:\d+)?$")


def resolve_device(setting: str, cuda_available: bool) -> str:
    if setting == "auto":
        return "cuda" if cuda_available else "cpu"
    if setting == "cpu":
        return "cpu"
    if _CUDA.match(setting):
        if not cuda_available:
            raise ConfigError(f"GPUFLEET_DEVICE={setting} but no CUDA device is visible to the runtime")
        return setting
    raise ConfigError(f"GPUFLEET_DEVICE must be auto, cpu, cuda or cuda:N, not {setting!r}")


def torch_device(setting: str) -> str:
    """:func:`resolve_device` with torch's own answer about CUDA."""
    import torch

    return resolve_device(setting, torch.cuda.is_available())
