"""A cloud GPU job's model load with and without the instance's host cache (docs/benchmarks.md "Cloud GPU instances:
the host cache").

Publishes a model folder of ``--mb`` MB (``--files`` weight files of random bytes and a ``model_index.json``) to S3
on a loopback moto server, then resolves it as back-to-back cloud jobs do, side by side in one run:

- ``per_job``: no host cache (``gpu_host_cache_gib`` 0): every job starts with an empty cache in its own container,
  so every job downloads the model and verifies it against its manifest;
- ``host_cache_rehash``: the jobs of one instance share its host cache: the first downloads, the next ones hit (no
  bytes moved) and hash the whole folder again against its manifest (``cache_reverify_s`` 0: every hit before
  remembered digests), and each evicts what exceeds the bound (the runtime's ``evict_host_cache``);
- ``host_cache``: the same with the default ``cache_reverify_s`` (a day): a hit hashes the folder only if it has not
  been hashed since its files last changed (:mod:`gpufleet.runtime.verified`): the first hit after the download
  still hashes (a digest is not remembered for files written within the last 2 s or while hashing), later ones
  read a record and stat the files.

Moto's S3 on loopback is much faster than S3 over an instance's network, so ``per_job`` is a lower bound of what a
job pays on AWS (a 5 GB model at 200-500 MB/s takes 10-25 s there). Prints one line per job, then one JSON object.

    python benchmarks/host_cache.py --mb 512 --jobs 6
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256, help="the model's size in MB")
    p.add_argument("--files", type=int, default=4, help="weight files it is split into")
    p.add_argument("--jobs", type=int, default=4, help="back-to-back jobs on one instance")
    args = p.parse_args(argv)

    import boto3
    from moto.server import ThreadedMotoServer

    from gpufleet.clock import SystemClock
    from gpufleet.models.loader import ModelLoader, publish_model
    from gpufleet.runtime.hostcache import ContentCache
    from gpufleet.runtime.verified import REVERIFY_S
    from gpufleet.store.objectstore import ObjectStore

    work = Path(tempfile.mkdtemp(prefix="gpufleet-host-cache-bench-"))
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        objects = ObjectStore(s3)
        folder = work / "model"
        folder.mkdir()
        (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
        per_file = args.mb * 2**20 // args.files
        for i in range(args.files):
            with open(folder / f"weights-{i:02d}.safetensors", "wb") as fh:
                for _ in range(per_file // 2**20):
                    fh.write(os.urandom(2**20))
        root = "s3://models/models/"
        publish_model(folder, objects, root, "bench-model")

        modes = ("per_job", "host_cache_rehash", "host_cache")
        rows: dict[str, list[dict]] = {m: [] for m in modes}
        for job in range(args.jobs):
            for mode in modes:  # alternate, so all see the same machine load
                cache = work / (f"container-{job}" if mode == "per_job" else f"instance-{mode}")
                reverify = 0.0 if mode == "host_cache_rehash" else REVERIFY_S
                t0 = time.monotonic()
                model = ModelLoader(cache, objects, s3_root=root, reverify_s=reverify).resolve("bench-model")
                if mode != "per_job":
                    ContentCache(cache, 4 * args.mb * 2**20, 600, clock=SystemClock(),
                                 reverify_s=reverify).evict(model.content_hash)
                seconds = time.monotonic() - t0
                rows[mode].append({"job": job, "seconds": round(seconds, 3), "bytes_moved": model.bytes_downloaded})
                print(f"{mode:17s} job {job}: {seconds:6.3f} s, {model.bytes_downloaded / 2**20:7.1f} MB moved",
                      flush=True)
                if mode == "per_job":
                    shutil.rmtree(cache)  # the container's disk goes with the job
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    def summary(mode: str) -> dict:
        after_first = [r["seconds"] for r in rows[mode][1:]] or [rows[mode][0]["seconds"]]
        return {"first_s": rows[mode][0]["seconds"], "later_median_s": round(statistics.median(after_first), 3),
                "mb_moved_total": round(sum(r["bytes_moved"] for r in rows[mode]) / 2**20, 1)}

    out = {"model_mb": args.mb, "files": args.files, "jobs": args.jobs, "load_avg_1m": round(os.getloadavg()[0], 2),
           **{m: summary(m) for m in modes}}
    later = {m: max(out[m]["later_median_s"], 1e-6) for m in modes}
    out["later_speedup"] = round(later["per_job"] / later["host_cache"], 2)
    out["remembered_over_rehash"] = round(later["host_cache_rehash"] / later["host_cache"], 2)
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
