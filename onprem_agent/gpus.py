"""GPU discovery and sampling through NVML (``nvidia-ml-py``), with a CPU-only fallback.

Contract:
- :func:`discover` returns an :class:`Inventory`. With a working NVML it lists the
  physical GPUs (index, name, memory, UUID) and ``kind == "nvml"``. Without a
  driver or library it returns ``cpu_slots`` CPU slots (``kind == "cpu"``): jobs
  then run with ``CUDA_VISIBLE_DEVICES`` empty, one job per slot.
- ``CUDA_VISIBLE_DEVICES`` in the agent's own environment restricts the GPUs it
  offers (indices or ``GPU-…`` UUIDs; empty → CPU-only), so an operator can keep
  GPUs for other uses. Indices are NVML's (PCI bus order); jobs get
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers devices the same way.
- :func:`sample` returns utilization and memory per GPU, or ``[]`` without NVML.
  It never raises for a missing driver.
- With NVML and two or more GPUs, ``Inventory.topology`` is their pairwise link matrix
  (:class:`gpufleet.topology.Topology`): NVLink where ``nvmlDeviceGetP2PStatus(…, NVLINK)`` is OK, else
  the level of ``nvmlDeviceGetTopologyCommonAncestor``. Any read that fails leaves it ``None``
  ("unknown"): a topology is never made up. A CPU inventory has none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from gpufleet.topology import Topology

log = logging.getLogger("onprem_agent.gpus")

#: Reported GPU type when NVML names a device we recognise (substring → spec.GPU_TYPES value).
_TYPE_NAMES = ("H200", "H100", "A100", "A10G", "L40S", "L4", "T4", "V100", "P100")


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    memory_gb: float
    uuid: str = ""


@dataclass(frozen=True)
class Inventory:
    kind: str  # "nvml" or "cpu"
    devices: tuple[Device, ...] = field(default_factory=tuple)
    driver: str = ""
    topology: Topology | None = None

    @property
    def gpu_type(self) -> str:
        if self.kind != "nvml" or not self.devices:
            return "cpu"
        name = self.devices[0].name.upper()
        for t in _TYPE_NAMES:
            if t in name:
                return t
        return self.devices[0].name

    @property
    def visible_indices(self) -> bool:
        """Whether slot indices are real CUDA device indices."""
        return self.kind == "nvml"


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization: float  # 0..1
    memory_used_bytes: int
    memory_total_bytes: int


def _load_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:  # no driver, no library, no device
        log.info("NVML unavailable, using CPU-only fallback", extra={"detail": str(err)})
        return None
    return pynvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def visible_filter(devices: list[Device], visible: str | None) -> list[Device]:
    """Keep the devices named in a ``CUDA_VISIBLE_DEVICES`` value (None: all of them)."""
    if visible is None:
        return devices
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    return [d for d in devices if str(d.index) in wanted or (d.uuid and d.uuid in wanted)]


#: NVML common-ancestor levels (NVML_TOPOLOGY_*) -> gpufleet.topology level names
_ANCESTOR_LEVELS = {0: "board", 10: "pcie-switch", 20: "pcie-switches", 30: "host-bridge", 40: "numa-node", 50: "system"}


def read_topology(lib: Any, devices: list[Device]) -> Topology | None:
    """The pairwise links of ``devices`` through NVML (module contract); ``None`` if any read fails."""
    if len(devices) < 2:
        return None
    try:
        handles = {d.index: lib.nvmlDeviceGetHandleByIndex(d.index) for d in devices}
        levels: dict[tuple[int, int], str] = {}
        for i, a in enumerate(devices):
            for b in devices[i + 1:]:
                ha, hb = handles[a.index], handles[b.index]
                try:
                    nvlink = lib.nvmlDeviceGetP2PStatus(ha, hb, lib.NVML_P2P_CAPS_INDEX_NVLINK) == lib.NVML_P2P_STATUS_OK
                except lib.NVMLError:  # this GPU or driver answers no NVLink status: the PCIe level decides
                    nvlink = False
                if nvlink:
                    levels[(a.index, b.index)] = "nvlink"
                    continue
                level = _ANCESTOR_LEVELS.get(int(lib.nvmlDeviceGetTopologyCommonAncestor(ha, hb)))
                if level is None:
                    return None
                levels[(a.index, b.index)] = level
    except (lib.NVMLError, AttributeError) as err:  # a failed read, or a library without these calls
        log.info("NVML topology unavailable", extra={"detail": str(err)})
        return None
    return Topology.of([d.index for d in devices], levels)


def discover(cpu_slots: int = 1, nvml: Any | None = None, visible: str | None = None) -> Inventory:
    """List local GPUs (NVML) or fall back to ``cpu_slots`` CPU slots.

    ``visible`` is the agent's ``CUDA_VISIBLE_DEVICES`` (None: unset); ``nvml`` injects a module.
    """
    lib = None if visible is not None and not visible.strip() else (nvml if nvml is not None else _load_nvml())
    if lib is not None:
        try:
            count = lib.nvmlDeviceGetCount()
            devices = []
            for i in range(count):
                h = lib.nvmlDeviceGetHandleByIndex(i)
                mem = lib.nvmlDeviceGetMemoryInfo(h)
                devices.append(
                    Device(
                        index=i,
                        name=_text(lib.nvmlDeviceGetName(h)),
                        memory_gb=round(mem.total / 1024**3, 1),
                        uuid=_text(lib.nvmlDeviceGetUUID(h)),
                    )
                )
            devices = visible_filter(devices, visible)
            if devices:
                return Inventory(kind="nvml", devices=tuple(devices), driver=_text(lib.nvmlSystemGetDriverVersion()),
                                 topology=read_topology(lib, devices))
        except lib.NVMLError as err:
            log.warning("NVML query failed, using CPU-only fallback", extra={"detail": str(err)})
    return Inventory(kind="cpu", devices=tuple(Device(index=i, name="cpu", memory_gb=0.0) for i in range(cpu_slots)))


class GpuSampler:
    """Samples utilization and memory of the inventory's GPUs (no-op for a CPU inventory)."""

    def __init__(self, inventory: Inventory, nvml: Any | None = None) -> None:
        self.inventory = inventory
        self._lib = None
        if inventory.kind == "nvml":
            self._lib = nvml if nvml is not None else _load_nvml()

    def sample(self) -> list[GpuSample]:
        if self._lib is None:
            return []
        out = []
        try:
            for d in self.inventory.devices:
                h = self._lib.nvmlDeviceGetHandleByIndex(d.index)
                util = self._lib.nvmlDeviceGetUtilizationRates(h)
                mem = self._lib.nvmlDeviceGetMemoryInfo(h)
                out.append(GpuSample(d.index, util.gpu / 100.0, int(mem.used), int(mem.total)))
        except self._lib.NVMLError as err:
            log.warning("NVML sample failed", extra={"detail": str(err)})
            return []
        return out
