"""Tier-2 frame moderation: recall / false-positive rate per class on the labelled frame set, and cost.

    PYTHONPATH=. python benchmarks/tier2_moderation.py [--threads 1] [--frames tests/data/frames]

Prints per-class figures for the ``standard`` backend at its default thresholds and, for comparison,
for the ``skin`` fallback at its default; then the model load time (first session in this process),
the scoring time per frame (256×256 and 512×512, batched), the face detector and age net per frame
(they run only on frames whose nudity score reaches the minors_risk threshold), and the whole moderation of clips of 9,
32 and 120 frames (scene detection + selection + scoring). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from gpufleet.safety import face_age, open_nsfw
from gpufleet.safety.frame_eval import evaluate, load_frame_set
from gpufleet.safety.frames import FrameModerator, SkinExposureBackend, StandardBackend


def _clip(n: int, side: int, rng) -> np.ndarray:
    """A clip of ``n`` frames in shots of 20 (each a noisy colour gradient, panned a pixel a frame)."""
    ramp = np.linspace(0, 1, side + n)[None, :, None]
    shots = [
        np.clip(
            rng.uniform(0, 255, 3) * (1 - ramp)
            + rng.uniform(0, 255, 3) * ramp
            + rng.normal(0, 20, (side, side + n, 3)),
            0,
            255,
        ).astype(np.uint8)
        for _ in range(-(-n // 20))
    ]
    return np.stack([shots[i // 20][:, i : i + side] for i in range(n)])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime and torch threads (default 1)")
    ap.add_argument("--frames", default="tests/data/frames")
    args = ap.parse_args(argv)
    out: dict = {"threads": args.threads, "load_avg_1m": round(os.getloadavg()[0], 2)}

    t = time.perf_counter()
    open_nsfw.session(args.threads)
    out["model_load_s"] = round(time.perf_counter() - t, 3)

    names, labels, frames = load_frame_set(args.frames)
    standard = StandardBackend(args.threads)
    scores = standard.score_batch(frames)
    out["standard"] = {"thresholds": standard.thresholds, "figures": evaluate(scores, labels, standard.thresholds)}
    skin = SkinExposureBackend()
    out["skin"] = {
        "thresholds": skin.thresholds,
        "figures": evaluate(skin.score_batch(frames), labels, skin.thresholds),
    }
    out["frames"] = {"total": len(names), "by_label": {lab: labels.count(lab) for lab in sorted(set(labels))}}
    for backend in ("standard", "skin"):
        for cat, fig in out[backend]["figures"].items():
            print(
                f"{backend:8s} {cat:17s} recall {fig['recall']} ({fig['positives']} frames)  "
                f"fpr {fig['fpr']} ({fig['negatives']} safe frames)"
            )

    rng = np.random.default_rng(0)
    for side in (256, 512):
        batch = rng.integers(0, 255, (32, side, side, 3), dtype=np.uint8)
        standard.score_batch(batch[:2])  # warm
        t = time.perf_counter()
        standard.score_batch(batch)
        out[f"score_ms_per_frame_{side}"] = round(1000 * (time.perf_counter() - t) / len(batch), 2)
    faces = frames[[names.index("photo_grace_hopper.jpg"), names.index("photo_astronaut.jpg")] * 4]
    import torch

    torch.set_num_threads(args.threads)
    face_age.detect_faces(faces[0])  # load the weights
    t = time.perf_counter()
    for f in faces:
        face_age.face_ages(f, face_age.detect_faces(f))
    out["faces_and_ages_ms_per_frame_256"] = round(1000 * (time.perf_counter() - t) / len(faces), 2)
    moderator = FrameModerator(standard)
    for n in (9, 32, 120):
        clip = _clip(n, 256, rng)
        t = time.perf_counter()
        result = moderator.moderate(clip)
        out[f"moderate_s_{n}_frames"] = round(time.perf_counter() - t, 3)
        out[f"checked_of_{n}"] = len(result.frames_checked)
    print(
        f"model load {out['model_load_s']} s; {out['score_ms_per_frame_256']} ms a 256-px frame, "
        f"{out['score_ms_per_frame_512']} ms a 512-px frame; moderation of 9 / 32 / 120 frames: "
        f"{out['moderate_s_9_frames']} / {out['moderate_s_32_frames']} / {out['moderate_s_120_frames']} s"
    )
    print(json.dumps(out, sort_keys=True))
    return out


if __name__ == "__main__":
    main()
