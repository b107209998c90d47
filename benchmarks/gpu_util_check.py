"""GPU check (needs an NVIDIA GPU, its driver, torch with CUDA and ``nvidia-ml-py``): does the runtime's
GPU-busy sampler (:mod:`gpufleet.runtime.gpuutil`) report the share of time a loop keeps the GPU busy?

A loop on ``cuda:0`` alternates, for ``--seconds`` per duty cycle, between launching matrix multiplies
back to back (synchronised each round, so the GPU is busy for the whole busy part) and sleeping on the
host (the GPU idle), at duty cycles 1.0, 0.5 and 0.0 by default. For each it reports what the sampler
measured (``gpu_busy``, samples) next to the duty cycle the loop imposed (the busy wall time over the
total, timed on the host after ``torch.cuda.synchronize``). NVML's ``utilization.gpu`` is a
percentage of its own sample period (1/6 s to 1 s by product) with a kernel running, so each window
lasts several seconds and the check passes when every measured share is within ``--tolerance`` of the
imposed one. It also checks that a CPU device gives *not measured* (None), never a number.

Usage (on a GPU host, from the repository root):
    .venv/bin/python benchmarks/gpu_util_check.py [--seconds 6] [--duties 1,0.5,0] [--tolerance 0.15]
The last line printed is a JSON object: ``{"ok": bool, "device": ..., "runs": [{"duty", "gpu_busy",
"samples"}, ...], "cpu_not_measured": bool}``; the exit status is 0 when ``ok``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _run(duty: float, seconds: float, period: float) -> dict:
    import torch

    from gpufleet.runtime.gpuutil import NvmlSampler, open_sampler

    a = torch.randn(4096, 4096, device="cuda:0")
    torch.cuda.synchronize()
    sampler = open_sampler("cuda:0")
    if not isinstance(sampler, NvmlSampler):
        return {"duty": duty, "gpu_busy": None, "samples": 0, "why": getattr(sampler, "reason", "")}
    sampler.start()
    busy_s, t0 = 0.0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        start = time.monotonic()
        while time.monotonic() - start < period * duty:
            for _ in range(8):
                a = a @ a
                a = a / a.norm()
            torch.cuda.synchronize()
        busy_s += time.monotonic() - start
        rest = period * (1 - duty)
        if rest > 0:
            time.sleep(rest)
    wall = time.monotonic() - t0
    got = sampler.stop()
    return {"duty": duty, "imposed": round(busy_s / wall, 3), "gpu_busy": None if got is None else got.share,
            "samples": 0 if got is None else got.samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--period", type=float, default=1.0, help="one busy+idle cycle, seconds")
    ap.add_argument("--duties", default="1,0.5,0")
    ap.add_argument("--tolerance", type=float, default=0.15)
    args = ap.parse_args()
    import torch

    from gpufleet.runtime.gpuutil import open_sampler

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "why": "no CUDA device"}))
        return 2
    runs = [_run(float(d), args.seconds, args.period) for d in args.duties.split(",")]
    cpu_not_measured = open_sampler("cpu").stop() is None
    ok = cpu_not_measured and all(r["gpu_busy"] is not None and abs(r["gpu_busy"] - r["imposed"]) <= args.tolerance
                                  for r in runs)
    for r in runs:
        print(f"duty {r['duty']:.2f}: imposed {r.get('imposed')}, NVML busy {r['gpu_busy']} ({r['samples']} samples)",
              file=sys.stderr)
    print(json.dumps({"ok": ok, "device": torch.cuda.get_device_name(0), "runs": runs,
                      "cpu_not_measured": cpu_not_measured}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
