"""The NODE# item, the child environment, GPU inventory fallback and the JSON log format."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from onprem_agent.child import child_environment
from onprem_agent.gpus import Device, GpuSampler, Inventory, discover
from onprem_agent.logs import configure, job_logger
from onprem_agent.node import node_item


def _item(**kw):
    inv = Inventory(kind="nvml", devices=(Device(0, "NVIDIA H100 80GB HBM3", 79.6), Device(1, "NVIDIA H100 80GB HBM3", 79.6)))
    args = dict(node_id="n1", pool="onprem-a", queue_url="https://q", inventory=inv, free_milli={0: 1000, 1: 250},
                gpu_type=None, cpu_milli_free=30000, memory_mib_free=1000, labels={"site": "x"},
                cached_models=["b" * 64, "a" * 64], datasets=["s3://d/1"], now=1_700_000_000.5, ttl_s=60,
                draining=False, running_jobs=1)
    args.update(kw)
    return node_item(**args)


def test_node_item_matches_the_contract():
    item = _item()
    assert item["gpu_type"] == "H100"
    assert item["gpus"] == [{"index": 0, "memory_gb": 79.6, "milli_free": 1000},
                            {"index": 1, "memory_gb": 79.6, "milli_free": 250}]
    assert item["expires_at"] == 1_700_000_060
    assert item["heartbeat_at"] == "2023-11-14T22:13:20.500Z"
    assert item["cached_models"] == ["a" * 64, "b" * 64]
    assert item["resident_models"] == []
    assert _item(resident_models=["wan-tiny", "a"])["resident_models"] == ["a", "wan-tiny"]
    for key in ("node_id", "pool", "queue_url", "gpu_type", "gpus", "cpu_milli_free", "memory_mib_free", "labels",
                "cached_models", "datasets", "heartbeat_at", "expires_at", "draining"):
        assert key in item


def test_a_draining_node_offers_no_capacity():
    item = _item(draining=True, gpu_type="A100")
    assert item["draining"] is True and item["gpu_type"] == "A100"
    assert all(g["milli_free"] == 0 for g in item["gpus"])


def test_cpu_fallback_without_nvml():
    inv = discover(cpu_slots=3)  # this CI machine has no NVIDIA driver
    assert inv.kind == "cpu" and [d.index for d in inv.devices] == [0, 1, 2]
    assert inv.gpu_type == "cpu" and not inv.visible_indices
    assert GpuSampler(inv).sample() == []


def test_visible_devices_filter():
    from onprem_agent.gpus import visible_filter

    devs = [Device(0, "g", 80, "GPU-aaa"), Device(1, "g", 80, "GPU-bbb"), Device(2, "g", 80, "GPU-ccc")]
    assert visible_filter(devs, None) == devs
    assert [d.index for d in visible_filter(devs, "2,0")] == [0, 2]
    assert [d.index for d in visible_filter(devs, "GPU-bbb")] == [1]
    assert discover(cpu_slots=2, visible="").kind == "cpu"  # CUDA_VISIBLE_DEVICES="" → CPU-only node


def test_child_environment():
    base = {"PATH": "/bin", "GPUFLEET_AGENT_NODE_ID": "secret-ish", "HOME": "/h"}
    env = child_environment(base, {"AWS_REGION": "eu-west-1"}, [2, 3], True, Path("/c"), "job_1", 4)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["GPUFLEET_CACHE_DIR"] == "/c"
    assert env["GPUFLEET_JOB_ID"] == "job_1" and env["GPUFLEET_EPOCH"] == "4" and env["AWS_REGION"] == "eu-west-1"
    assert "GPUFLEET_AGENT_NODE_ID" not in env and env["PATH"] == "/bin"
    cpu = child_environment(base, {}, [0], False, Path("/c"), "job_1", 4)
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""  # CPU slot: no GPU visible to the job


def test_json_logs_carry_job_context():
    buf = io.StringIO()
    configure("INFO", node="n1", stream=buf)
    job_logger("job_9", 2).info("job ended", extra={"returncode": 0})
    logging.getLogger("onprem_agent.agent").debug("hidden")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(lines) == 1
    rec = lines[0]
    assert rec["msg"] == "job ended" and rec["job_id"] == "job_9" and rec["epoch"] == 2
    assert rec["returncode"] == 0 and rec["node"] == "n1" and rec["level"] == "INFO" and rec["ts"].endswith("Z")


class _NvmlStandIn:
    """The slice of the NVML API the agent calls, for the mapping logic only: this CI machine has no
    NVIDIA driver, so the real library cannot answer here (it is exercised on GPU hosts)."""

    class NVMLError(Exception):
        pass

    class _Mem:
        def __init__(self, total, used):
            self.total, self.used = total, used

    class _Util:
        gpu = 37

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._Mem(80 * 1024**3, 5 * 1024**3)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlSystemGetDriverVersion(self):
        return "550.54"

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._Util()


def test_nvml_inventory_and_samples_mapping():
    nvml = _NvmlStandIn()
    inv = discover(nvml=nvml)
    assert inv.kind == "nvml" and inv.gpu_type == "H100" and inv.driver == "550.54" and inv.visible_indices
    assert inv.devices[1] == Device(1, "NVIDIA H100 80GB HBM3", 80.0, "GPU-1")
    assert [d.index for d in discover(nvml=nvml, visible="GPU-1").devices] == [1]
    samples = GpuSampler(inv, nvml=nvml).sample()
    assert [(s.index, s.utilization, s.memory_used_bytes) for s in samples] == [(0, 0.37, 5 * 1024**3), (1, 0.37, 5 * 1024**3)]


def test_the_report_names_resident_models_only_when_there_are_some():
    from gpufleet.nodeapi.liveness import LivenessReport
    from onprem_agent.aws import NodeRegistry

    cold = NodeRegistry.report(_item())
    assert "resident_models" not in cold  # compatible with a node API that predates the field
    warm = NodeRegistry.report(_item(resident_models=["wan-tiny"]))
    assert warm["resident_models"] == ["wan-tiny"]
    assert LivenessReport.model_validate(warm).resident_models == ["wan-tiny"]


class _DgxNvml(_NvmlStandIn):
    """Eight GPUs in two NVLink islands (0-3, 4-7): NVLink P2P inside an island, SYSTEM across sockets."""

    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    fail_ancestor = False

    def nvmlDeviceGetCount(self):
        return 8

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        return self.NVML_P2P_STATUS_OK if a // 4 == b // 4 else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        if self.fail_ancestor:
            raise self.NVMLError("Not Supported")
        return 50  # NVML_TOPOLOGY_SYSTEM


def test_nvml_topology_is_read_and_advertised_compactly():
    from gpufleet.nodeapi.liveness import LivenessReport
    from onprem_agent.aws import NodeRegistry

    inv = discover(nvml=_DgxNvml())
    assert inv.topology is not None and inv.topology.level(0, 3) == "nvlink" and inv.topology.level(3, 4) == "system"
    item = _item(inventory=inv)
    assert item["gpu_topology"] == "NNNXXXX" "NNXXXX" "NXXXX" "XXXX" "NNN" "NN" "N"
    report = NodeRegistry.report(item)
    assert LivenessReport.model_validate(report).topology == item["gpu_topology"]
    # a read that fails leaves the topology unknown (never made up), and nothing is advertised
    failing = _DgxNvml()
    failing.fail_ancestor = True
    assert discover(nvml=failing).topology is None
    assert discover(nvml=_NvmlStandIn()).topology is None  # a library without the calls
    assert "topology" not in NodeRegistry.report(_item())
