"""Keyed watermark: embed/detect time on a 512×512 × 16-frame clip, and the robustness table.

Usage: .venv/bin/python benchmarks/watermark.py [--frames 16] [--side 512] [--rounds 3]

For the natural-statistics clip (``--side``) and the smooth 256×256 "generated" one
(:mod:`gpufleet.provenance.robustness`): PSNR of the mark; median embed and detect seconds over
``--rounds`` (single process, the machine as it is); for every transform the detection's validity,
payload bits right (of 48), coded bits Reed–Solomon corrected (of 128), sync z and the scale/flip
found; then forgeries (a chosen payload stamped under another key, or with the public
invisible-watermark ``dwtDctSvd``) and erasure attempts without the key (re-marking under another
key; subtracting the frames' mean high-pass residual once, twice or four times), with the PSNR
the attack leaves. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from gpufleet.provenance import robustness, watermark
from gpufleet.provenance.watermark import WatermarkKey

KEY = WatermarkKey(bytes(range(32)))
ATTACKER = WatermarkKey(b"\xa5" * 32)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return round(10 * np.log10(255**2 / mse), 2) if mse else float("inf")


def timed(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times), 3), out


def row(found: watermark.Detection, bits: list[int]) -> dict:
    return {"valid": found.valid, "bits_right": found.matches(bits), "coded_errors": found.raw_bit_errors,
            "sync_z": round(found.sync_z, 1), "scale": round(found.scale, 3), "flipped": found.flipped}


def measure(name: str, clip: np.ndarray, rounds: int) -> dict:
    import cv2

    bits = watermark.payload_for_job(f"job_bench_{name}")
    evil = watermark.payload_for_job("job_bench_forged")
    t_embed, marked = timed(lambda: watermark.embed(clip, bits, KEY), rounds)
    t_detect, _ = timed(lambda: watermark.detect(marked, [KEY]), rounds)
    t_absent, _ = timed(lambda: watermark.detect(clip, [KEY]), 1)
    out = {"clip": name, "shape": list(clip.shape), "psnr_db": psnr(clip, marked), "embed_s": t_embed,
           "detect_s": t_detect, "detect_unmarked_s": t_absent, "transforms": {}, "forgery": {}, "erasure": {}}
    for tname, fn in robustness.TRANSFORMS.items():
        out["transforms"][tname] = row(watermark.detect(fn(marked), [KEY]), bits)
    out["unmarked"] = row(watermark.detect(clip, [KEY]), bits)

    from imwatermark import WatermarkEncoder

    enc = WatermarkEncoder()
    enc.set_watermark("bits", evil)
    public = np.stack([enc.encode(np.ascontiguousarray(f[:, :, ::-1]), "dwtDctSvd")[:, :, ::-1] for f in clip[:4]])
    out["forgery"]["other_key"] = row(watermark.detect(watermark.embed(clip, evil, ATTACKER), [KEY]), evil)
    out["forgery"]["public_dwtDctSvd"] = row(watermark.detect(public, [KEY]), evil)
    remarked = watermark.embed(marked, evil, ATTACKER)
    out["erasure"]["remark_other_key"] = {**row(watermark.detect(remarked, [KEY]), bits), "psnr_db": psnr(clip, remarked)}
    f = marked.astype(np.float32)
    residual = (f - np.stack([cv2.GaussianBlur(x, (0, 0), 2.5) for x in f])).mean(axis=0)
    for a in (1, 2, 4):
        attacked = np.clip(np.rint(f - a * residual), 0, 255).astype(np.uint8)
        out["erasure"][f"subtract_mean_residual_x{a}"] = {**row(watermark.detect(attacked, [KEY]), bits),
                                                          "psnr_db": psnr(clip, attacked)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--side", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = [measure(f"natural{args.side}", robustness.natural_clip(args.frames, args.side), args.rounds),
               measure("generated256", robustness.generated_clip(args.frames, 256), args.rounds)]
    for r in results:
        print(f"{r['clip']} {r['shape']}: PSNR {r['psnr_db']} dB, embed {r['embed_s']} s, detect {r['detect_s']} s "
              f"(unmarked: {r['detect_unmarked_s']} s)")
        for group in ("transforms", "forgery", "erasure"):
            for k, v in r[group].items():
                print(f"  {group:10s} {k:28s} {json.dumps(v)}")
        print(f"  unmarked   {json.dumps(r['unmarked'])}")
    print(json.dumps({"benchmark": "watermark", "frames": args.frames, "rounds": args.rounds, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
