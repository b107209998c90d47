"""Time and peak memory of the finalize stage's work on one clip, by size: the measurement behind FinalizeLambda's
bound (gpufleet/finalize_route.py LAMBDA_MAX_PIXELS; docs/benchmarks.md "Finalize: the Lambda bound").

Runs what the stage runs on a clip of ``FRAMES`` frames delivered at ``SIDE`` × ``SIDE`` (generated at 64 px, as
wan-tiny does, then upscaled): resize, tier-2 moderation (the deployment's backend), watermark, H.264, C2PA signing
with development credentials — in this process, after the models are loaded (a warm Lambda environment). Prints one
JSON line per size (give them in ascending order): seconds, seconds per million pixels, the process's peak RSS and the
bytes per pixel above the warm baseline.

    python benchmarks/finalize_bound.py 9x256 33x512 65x768
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def main(sizes: list[str]) -> int:
    import numpy as np

    from gpufleet.provenance import keys, manifest, video, watermark
    from gpufleet.runtime.settings import RuntimeSettings
    from gpufleet.safety.profile import FrozenSafety

    state = Path(tempfile.mkdtemp(prefix="gpufleet-finalize-bound-"))
    settings = RuntimeSettings.load()
    moderator = FrozenSafety(source="default", profile_version=0).moderator(settings.moderation_backend,
                                                                             settings.torch_threads)
    creds, key = keys.dev_credentials(state), keys.dev_watermark_keys(state)[0]
    moderator.moderate(np.zeros((1, 256, 256, 3), np.uint8))  # warm: the models are loaded once per environment
    warm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for size in sizes:  # ascending: the peak RSS only grows, so each size's peak is its own

        frames_n, side = (int(x) for x in size.split("x"))
        t0 = time.monotonic()
        generated = np.random.default_rng(0).random((frames_n, 64, 64, 3), dtype=np.float32)
        frames = video.resize(video.to_uint8(generated), side, side)
        moderator.moderate(frames)
        bits = watermark.payload_for_job("job_bound")
        mp4 = video.encode_mp4(watermark.embed(frames, bits, key), fps=8)
        definition = manifest.build_manifest(job_id="job_bound", model="wan-tiny", model_hash="", prompt_sha256="",
                                             watermark_payload=watermark.bits_to_hex(bits), watermark_key_id=key.key_id)
        manifest.sign_mp4(mp4, definition, creds, None)
        seconds = time.monotonic() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        pixels = frames_n * side * side
        print(json.dumps({"frames": frames_n, "side": side, "pixels": pixels, "seconds": round(seconds, 2),
                          "s_per_mpx": round(seconds / pixels * 1e6, 3), "warm_rss_mb": warm // 1024,
                          "peak_rss_mb": peak // 1024, "bytes_per_pixel": round((peak - warm) * 1024 / pixels, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["9x256", "33x512", "65x768"]))
