"""A two-member gang through the runtime's container stage, for real: both members' runtimes (rank 0 and rank 1 of
one attempt, as two agents on this host run them) start the torch image built from this host's files, rank 1's
container joins rank 0's loopback-only namespace (gang_network local), and the docs' example program all-reduces
over gloo on the CPU; each member uploads its rank's result under the attempt's output prefix."""

from __future__ import annotations

import io
import json
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
    return torch_image.ensure_image(oci.podman, app={"/app/allreduce.py": EXAMPLES / "gang_allreduce.py"})


def _role(job_id: str, epoch: int, rank: int) -> dict:
    return {"rank": rank, "world_size": 2, "nodes": ["node-a", "node-b"], "master_addr": "node-a",
            "master_port": gang.master_port(job_id, epoch)}


def test_two_members_all_reduce_over_gloo_in_their_shared_namespace(aws, oci, torch_image, tmp_path):
    spec = json.loads((EXAMPLES / "gang_allreduce.json").read_text())
    aws.put_job("job_g1", 1, spec)
    codes: dict[int, tuple[int, dict]] = {}

    def member(rank: int) -> None:
        settings = RuntimeSettings(state_dir=str(tmp_path / f"r{rank}" / "state"),
                                   cache_dir=str(tmp_path / f"r{rank}" / "cache"), log_flush_s=0,
                                   container_grace_s=2, **oci.settings)
        envelope = aws.envelope("job_g1", 1, spec, stage="container", gang=_role("job_g1", 1, rank))
        out = io.StringIO()
        code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                    stdout=out, install_signals=False)
        codes[rank] = (code, json.loads(out.getvalue().splitlines()[-1]))

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (1, 0)]  # rank 1 first: it waits
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert {rank: code for rank, (code, _) in codes.items()} == {0: ExitCode.SUCCEEDED, 1: ExitCode.SUCCEEDED}, codes
    results = [json.loads(aws.get("bucket_outputs", f"jobs/job_g1/output/e0001/rank{r}.json")) for r in (0, 1)]
    for rank, got in enumerate(results):
        assert got["rank"] == rank and got["world_size"] == 2 and got["contributed"] == rank + 1
        assert got["all_reduce_sum"] == 3.0 and got["gathered"] == [1.0, 2.0] and got["epoch"] == "1"
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_g1/"))
    assert b"joining the network namespace of gpufleet-job_g1-e0001-r0" in logs
    assert b"rank 1/2: all_reduce sum 3.0" in logs and b"rank 0/2: all_reduce sum 3.0" in logs
