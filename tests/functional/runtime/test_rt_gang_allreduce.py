"""A two-member gang through the runtime's container stage, for real: both members' runtimes (rank 0 and rank 1 of
one attempt, as two agents on this host run them) start their containers, rank 1's joins rank 0's loopback-only
namespace (gang_network local), and the members talk at MASTER_ADDR:MASTER_PORT; each member uploads its rank's
result under the attempt's output prefix.

By default over the small tools image (a TCP exchange, ~5 s). The docs' gloo all-reduce over the torch image
built from this host's files (~700 MB: two container starts and two torch imports, 10-20 s on 2 shared cores,
plus ~30 s to build the image once per machine) runs with ``GPUFLEET_E2E_GANG=1`` (as the gang e2e does)."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest

from gpufleet import gang
from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def torch_image(oci):
    from gpufleet.local import torch_image

    reason = torch_image.unavailable()
    if reason:
        pytest.skip(f"the torch image cannot be built here: {reason}")
    return torch_image.ensure_image(oci.podman, app=torch_image.EXAMPLE_APP)


#: rank 0 serves at MASTER_ADDR:MASTER_PORT, rank 1 connects (retrying while rank 0 starts); each records what the
#: other said
EXCHANGE = r"""
import json, os, socket, time
rank, addr = int(os.environ["RANK"]), (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    srv = socket.create_server(addr)
    conn, _ = srv.accept()
else:
    for _ in range(200):
        try:
            conn = socket.create_connection(addr, timeout=2)
            break
        except OSError:
            time.sleep(0.1)
conn.sendall(f"hello from rank {rank}\n".encode())
heard = conn.makefile().readline().strip()
env = {k: os.environ[k] for k in ("MASTER_ADDR", "WORLD_SIZE", "GLOO_SOCKET_IFNAME")}
json.dump({"rank": rank, "heard": heard, "env": env}, open(os.path.join(os.environ["GPUFLEET_OUTPUT_DIR"], f"rank{rank}.json"), "w"))
"""


def _role(job_id: str, epoch: int, rank: int) -> dict:
    return {"rank": rank, "world_size": 2, "nodes": ["node-a", "node-b"], "master_addr": "node-a",
            "master_port": gang.master_port(job_id, epoch)}


def _run_gang(aws, oci, tmp_path, job_id: str, spec: dict) -> list[dict]:
    """Both members' runtimes at once (rank 1 first: it waits for rank 0); each rank's uploaded result."""
    aws.put_job(job_id, 1, spec)
    codes: dict[int, tuple[int, dict]] = {}

    def member(rank: int) -> None:
        settings = RuntimeSettings(state_dir=str(tmp_path / f"r{rank}" / "state"),
                                   cache_dir=str(tmp_path / f"r{rank}" / "cache"), log_flush_s=0,
                                   container_grace_s=2, **oci.settings)
        envelope = aws.envelope(job_id, 1, spec, stage="container", gang=_role(job_id, 1, rank))
        out = io.StringIO()
        code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                    stdout=out, install_signals=False)
        codes[rank] = (code, json.loads(out.getvalue().splitlines()[-1]))

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert {rank: code for rank, (code, _) in codes.items()} == {0: ExitCode.SUCCEEDED, 1: ExitCode.SUCCEEDED}, codes
    return [json.loads(aws.get("bucket_outputs", f"jobs/{job_id}/output/e0001/rank{r}.json")) for r in (0, 1)]


def test_two_members_meet_at_master_addr_in_their_shared_loopback_namespace(aws, oci, tmp_path):
    spec = {"workload": {"kind": "container", "image": oci.image, "command": ["python3", "-c", EXCHANGE]},
            "resources": {"gpus": 1, "nodes": 2}}
    results = _run_gang(aws, oci, tmp_path, "job_g0", spec)
    assert [r["heard"] for r in results] == ["hello from rank 1", "hello from rank 0"]
    for r in results:
        assert r["env"] == {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo"}
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_g0/"))
    assert b"joining the network namespace of gpufleet-job_g0-e0001-r0" in logs


@pytest.mark.skipif(os.environ.get("GPUFLEET_E2E_GANG") != "1",
                    reason="opt-in (the ~700 MB torch image, 10-20 s): GPUFLEET_E2E_GANG=1")
def test_two_members_all_reduce_over_gloo_in_their_shared_namespace(aws, oci, torch_image, tmp_path):
    spec = json.loads((EXAMPLES / "gang_allreduce.json").read_text())
    results = _run_gang(aws, oci, tmp_path, "job_g1", spec)
    for rank, got in enumerate(results):
        assert got["rank"] == rank and got["world_size"] == 2 and got["contributed"] == rank + 1
        assert got["all_reduce_sum"] == 3.0 and got["gathered"] == [1.0, 2.0] and got["epoch"] == "1"
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_g1/"))
    assert b"joining the network namespace of gpufleet-job_g1-e0001-r0" in logs
    assert b"rank 1/2: all_reduce sum 3.0" in logs and b"rank 0/2: all_reduce sum 3.0" in logs
