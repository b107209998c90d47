"""``gpufleet verify FILE``: whose video (or frame) is this? Its C2PA manifest, or the platform's by watermark.

Two checks, reported together:

- **C2PA** in the file itself (:func:`gpufleet.provenance.verify`, against ``--trust-anchors PEM``
  or the profile's): ``Trusted``/``Valid``/``Invalid``/``None``. A copy that was remuxed, re-encoded
  or cropped usually has ``None``: its manifest is gone.
- **Watermark lookup**: the file's frames (a video through PyAV, or a still image) are reduced to their
  mean luma — halved until at most 1920×1088 px — and sent to ``POST /v1/provenance/lookup``. The
  platform, which alone holds the watermark key, detects the mark and returns the kept, signed
  manifests of the jobs whose payload it carries. With ``-o DIR`` each match's manifest store is saved
  as ``DIR/<job-id>.c2pa`` and, for the caller's own jobs, the signed original as ``DIR/<job-id>.mp4``,
  which is then verified (its C2PA state is reported).

Exit 0 when the file's own manifest is Trusted or the lookup matched a job; 4 when neither; 1/2
for API errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.cli.common import (
    EXIT_OK,
    EXIT_VERIFY_FAILED,
    add_connection_args,
    add_json_arg,
    make_client,
    print_json,
)
from gpufleet.cli.output import read_trust_anchors

#: the largest plane the lookup takes (the API's limit)
MAX_PIXELS = 1920 * 1088
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="find a video's (or frame's) provenance: its C2PA manifest, or the platform's "
                       "kept manifest by watermark")
    p.add_argument("file", type=Path)
    p.add_argument("--trust-anchors", help="PEM of C2PA trust anchors (default: the profile's)")
    p.add_argument("-o", "--out-dir", type=Path, help="save the matched manifests (and your own originals) here")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def read_frames(path: Path):
    """uint8 RGB frames (n, h, w, 3) of a video, or one frame of a still image."""
    import numpy as np

    if path.suffix.lower() in IMAGE_SUFFIXES:
        from PIL import Image

        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))[None]
    from gpufleet.provenance.video import decode_mp4

    return decode_mp4(path)


def lookup_plane(frames) -> Any:
    """The frames' mean luma, halved (2×2 means) until it fits the lookup's limit."""
    from gpufleet.provenance.watermark import mean_luma

    luma = mean_luma(frames)
    while luma.shape[0] * luma.shape[1] > MAX_PIXELS:
        h, w = luma.shape[0] // 2 * 2, luma.shape[1] // 2 * 2
        luma = luma[:h, :w].reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).round().astype("uint8")
    return luma


def run(args: argparse.Namespace) -> int:
    from gpufleet.errors import ValidationFailed
    from gpufleet.provenance import verify

    if not args.file.is_file():  # said before any endpoint or profile is needed
        raise ValidationFailed(f"{args.file}: no such file")
    client = make_client(args)
    anchors = read_trust_anchors(args.trust_anchors, client.profile.trust_anchors)
    report: dict[str, Any] = {"file": str(args.file)}
    if args.file.suffix.lower() not in IMAGE_SUFFIXES:
        own = verify(args.file, anchors)
        report.update(c2pa_state=own.c2pa_state, manifest_job_id=own.job_id)
    else:
        report.update(c2pa_state="None", manifest_job_id=None)
    try:
        frames = read_frames(args.file)
    except Exception as err:  # not a video or image we can decode
        raise ValidationFailed(f"cannot read frames from {args.file}: {type(err).__name__}: {err}")
    found = client.provenance_lookup(lookup_plane(frames))
    report["lookup"] = found.model_dump()
    for m in found.matches:
        if args.out_dir:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            client.download(m.manifest_url, args.out_dir / f"{m.job_id}.c2pa")
            if m.video_url:
                original = client.download(m.video_url, args.out_dir / f"{m.job_id}.mp4")
                report.setdefault("originals", {})[m.job_id] = verify(original, anchors).c2pa_state
    ok = report["c2pa_state"] == "Trusted" or bool(found.matches)
    report["ok"] = ok
    if args.json:
        print_json(report)
    else:
        print("\n".join(format_lines(report)))
    return EXIT_OK if ok else EXIT_VERIFY_FAILED


def format_lines(report: dict[str, Any]) -> list[str]:
    """The verification as human-readable lines (pure)."""
    lk = report["lookup"]
    lines = [f"C2PA:      {report['c2pa_state']}"
             + (f"  (manifest job {report['manifest_job_id']})" if report.get("manifest_job_id") else "")]
    if lk["found"]:
        how = f"scale {lk['scale']:g}" + (", mirrored" if lk.get("flipped") else "")
        lines.append(f"watermark: {lk['watermark_payload']} found by the platform (key {lk['watermark_key_id']}, "
                     f"sync z {lk['sync_z']:.1f}, {how})")
    else:
        lines.append(f"watermark: none found by the platform (sync z {lk['sync_z']:.1f})")
    for m in lk["matches"]:
        extra = f"; original: {report['originals'][m['job_id']]}" if m["job_id"] in report.get("originals", {}) else ""
        lines.append(f"match:     job {m['job_id']} published {m.get('published_at')} "
                     f"(video sha256 {str(m.get('video_sha256'))[:16]}…){' — yours' if m.get('own') else ''}{extra}")
    if lk["found"] and not lk["matches"]:
        lines.append("match:     none (no published job carries this payload)")
    return lines
