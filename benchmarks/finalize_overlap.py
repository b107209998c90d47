"""Benchmark: the finalize stage with the watermarked MP4 made while moderation runs, vs one after the other.

The real stage (``gpufleet.runtime.main.main`` with a ``finalize`` envelope: the job item's epoch check, the
persisted output read and checked, tier-2 moderation with the deployment's backend, watermark, H.264, C2PA signing
with development credentials, the uploads and the fenced result) against moto in this process, models loaded once
(a warm FinalizeLambda environment), on clips generated at 64 px and delivered at each ``--sizes`` entry. Rounds
alternate ``finalize_overlap`` on and off per size, so load drifts hit both; figures are medians of ``--rounds``.
Every delivered video is decoded and the two modes' frames must be bitwise equal (exit 1 otherwise).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/finalize_overlap.py [--sizes 9x256,33x512] [--rounds 5]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_REGION": "us-east-1"}
BUCKETS = {"bucket_outputs": "bench-outputs", "bucket_checkpoints": "bench-checkpoints", "bucket_logs": "bench-logs"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="9x256,33x512", help="FRAMESxSIDE delivered, comma separated")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.update(AWS_ENV)
    os.environ.pop("AWS_ENDPOINT_URL", None)

    import boto3
    import numpy as np
    from moto import mock_aws

    from gpufleet.local import moto_patches
    from gpufleet.provenance.video import decode_mp4
    from gpufleet.runtime.generate import pack_output
    from gpufleet.runtime.main import main as runtime_main
    from gpufleet.runtime.settings import RuntimeSettings
    from gpufleet.store.dynamo import marshal
    from gpufleet.store.objectstore import sha256_hex
    from gpufleet.store.schema import create_tables
    from gpufleet.tables import JOB_META, TableNames, job_pk

    tmp = Path(tempfile.mkdtemp(prefix="bench-finalize-overlap-"))
    base = RuntimeSettings(state_dir=str(tmp / "state"), cache_dir=str(tmp / "cache"), log_flush_s=5, dev_mode=True)
    tables = TableNames()
    load_before = os.getloadavg()
    results: dict[str, dict[str, list[float]]] = {}
    equal = True
    with mock_aws(), moto_patches.patch_dynamodb_serialised():
        ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_tables(ddb, tables)
        for b in BUCKETS.values():
            s3.create_bucket(Bucket=b)
        n = 0
        for size in args.sizes.split(","):
            frames_n, side = (int(x) for x in size.split("x"))
            spec = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow", "width": side,
                                 "height": side, "frames": frames_n, "steps": 10, "seed": 1}}
            clip = np.random.default_rng(frames_n).random((frames_n, 64, 64, 3), dtype=np.float32) * 0.3 + 0.4
            clip[..., 2] = 0.85  # blue-ish: nothing blocks it
            data = pack_output(clip, {"model": "wan-tiny", "model_hash": "m", "prompt_sha256": "p", "fps": 8})
            results[size] = {"overlap": [], "serial": []}
            delivered: dict[bool, np.ndarray] = {}
            for r in range(args.rounds + 1):  # round 0 warms the models and the code paths; not counted
                for overlap in ((True, False) if r % 2 == 0 else (False, True)):
                    n += 1
                    job_id = "job_bench_overlap"  # one job id: the same watermark payload in both modes
                    raw = f"jobs/{job_id}/generated/e{n:04d}.npz"
                    s3.put_object(Bucket=BUCKETS["bucket_outputs"], Key=raw, Body=data)
                    s3.delete_object(Bucket=BUCKETS["bucket_outputs"], Key=f"jobs/{job_id}/finalize.json")
                    ddb.put_item(TableName=tables.jobs, Item=marshal({
                        "pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "status": "FINALIZING",
                        "current_epoch": 1, "spec": spec, "generated": {"key": raw, "sha256": sha256_hex(data)}}))
                    env = {"job_id": job_id, "attempt": 1, "epoch": 1, "stage": "finalize", "spec": spec,
                           "s3": {**BUCKETS, "output_prefix": f"jobs/{job_id}/", "checkpoint_prefix": f"jobs/{job_id}/",
                                  "log_prefix": f"jobs/{job_id}/attempt-0001/"}, "tables": {"jobs": tables.jobs}}
                    out = io.StringIO()
                    t0 = time.monotonic()
                    code = runtime_main(["--envelope-json", json.dumps(env)], stdout=out, install_signals=False,
                                        settings=base.model_copy(update={"finalize_overlap": overlap}), s3=s3,
                                        dynamodb=ddb)
                    seconds = time.monotonic() - t0
                    result = json.loads(out.getvalue().splitlines()[-1])
                    if code != 0 or result.get("blocked"):
                        print(f"finalize failed: {code} {result}", file=sys.stderr)
                        return 1
                    if r > 0:
                        results[size]["overlap" if overlap else "serial"].append(seconds)
                    video = s3.get_object(Bucket=BUCKETS["bucket_outputs"], Key=result["video_key"])["Body"].read()
                    frames = decode_mp4(video)
                    if overlap in delivered and not np.array_equal(delivered[overlap], frames):
                        equal = False
                    delivered[overlap] = frames
            equal = equal and np.array_equal(delivered[True], delivered[False])
            med = {k: statistics.median(v) for k, v in results[size].items()}
            print(f"{size}: serial {med['serial']:.3f} s, overlap {med['overlap']:.3f} s "
                  f"(x{med['serial'] / med['overlap']:.2f}); rounds {results[size]}")
    summary = {
        "sizes": {s: {"serial_s": round(statistics.median(v["serial"]), 3),
                      "overlap_s": round(statistics.median(v["overlap"]), 3),
                      "speedup": round(statistics.median(v["serial"]) / statistics.median(v["overlap"]), 2)}
                  for s, v in results.items()},
        "rounds": args.rounds, "frames_equal": bool(equal), "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(summary))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
