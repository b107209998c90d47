"""``gpufleet output JOB``: download a SUCCEEDED job's video, then verify its provenance; for a
container job, download every file it wrote under its output directory to ``<dir>/<job-id>/``.

Writes ``<dir>/<job-id>.mp4`` (and the C2PA manifest store as ``<job-id>.c2pa`` when the API
offers it), then checks with :func:`gpufleet.provenance.verify`:

- the C2PA manifest validates and chains to a trusted anchor (``--trust-anchors PEM``, else
  the profile's, which ``gpufleet dev`` sets to the local development root), and names this job;
- the keyed invisible watermark is found: a valid detection (sync peak and Reed–Solomon decode,
  :mod:`gpufleet.provenance.watermark`) under the watermark keys (``--watermark-keys FILE``, else
  the profile's, which ``gpufleet dev`` sets to the development key) whose payload has at least
  :data:`WATERMARK_MIN_BITS` of its 48 bits matching the job's. The keys are the platform's
  secret: without them the watermark is reported as not checked (not a failure); ``gpufleet
  verify FILE`` asks the platform, which holds them.

Exit 0 when both hold, 4 when either fails (the reason is printed), 1/2 for API errors.
``--no-verify`` only downloads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpufleet.cli.common import EXIT_OK, EXIT_VERIFY_FAILED, add_connection_args, add_json_arg, make_client, print_json

#: Bits of the 48-bit payload that must match for the watermark to count as found.
WATERMARK_MIN_BITS = 44
WATERMARK_BITS = 48


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "output",
        help="download a job's video (and verify C2PA + watermark) or a container job's files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job_id")
    p.add_argument("-o", "--out-dir", default="out", help="where to write <job-id>.mp4 (default: out/)")
    p.add_argument("--trust-anchors", metavar="PEM", help="C2PA trust anchors (default: the profile's)")
    p.add_argument("--no-verify", action="store_true", help="download only")
    p.add_argument("--watermark-keys", help="watermark key file (default: the profile's)")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def bits_matching(a_hex: str | None, b_hex: str | None) -> int:
    """How many of the 48 bits two 12-hex-digit payloads share (0 if either is missing) (pure)."""
    if not a_hex or not b_hex:
        return 0
    a, b = int(a_hex, 16), int(b_hex, 16)
    return WATERMARK_BITS - bin((a ^ b) & ((1 << WATERMARK_BITS) - 1)).count("1")


def verification_report(job_id: str, expected_payload: str, result: Any) -> dict[str, Any]:
    """Judge a :class:`gpufleet.provenance.VerifyResult` for ``job_id`` (pure).

    ``ok`` is true when the manifest is Trusted and names this job, and the watermark is found.
    ``problems`` lists, one line each, what failed.
    """
    matching = bits_matching(result.watermark_payload, expected_payload)
    report: dict[str, Any] = {
        "job_id": job_id,
        "c2pa_state": result.c2pa_state,
        "c2pa_trusted": result.c2pa_state == "Trusted",
        "manifest_job_id": result.job_id,
        "watermark_expected": expected_payload,
        "watermark_payload": result.watermark_payload,
        "watermark_bits_matching": matching,
        "watermark_checked": bool(getattr(result, "watermark_checked", True)),
        "watermark_key_id": getattr(result, "watermark_key_id", None),
        "watermark_found": matching >= WATERMARK_MIN_BITS,
        "watermark_confidence": round(float(result.watermark_confidence), 4),
        "failures": list(result.failures),
    }
    problems = []
    if not report["c2pa_trusted"]:
        hint = " (signer not among the trust anchors)" if result.c2pa_state == "Valid" else ""
        problems.append(f"C2PA manifest is {result.c2pa_state}{hint}")
    if result.job_id is not None and result.job_id != job_id:
        problems.append(f"C2PA manifest names job {result.job_id}, not {job_id}")
    if report["watermark_checked"] and not report["watermark_found"]:
        problems.append(f"watermark not found ({matching}/{WATERMARK_BITS} bits match, need {WATERMARK_MIN_BITS})")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def format_report(report: dict[str, Any]) -> list[str]:
    """The verification as human-readable lines (pure)."""
    mark = {True: "ok", False: "FAILED"}
    lines = [
        f"C2PA:      {report['c2pa_state']:<8} {mark[report['c2pa_trusted']]}"
        + (f"  (manifest job {report['manifest_job_id']})" if report["manifest_job_id"] else ""),
        f"watermark: {report['watermark_payload'] or 'none':<12} "
        f"{mark[report['watermark_found']]}  ({report['watermark_bits_matching']}/{WATERMARK_BITS} bits match "
        f"{report['watermark_expected']})"
        if report.get("watermark_checked", True) else "watermark: not checked (no watermark key; `gpufleet verify` "
        "asks the platform)",
    ]
    lines += [f"problem:   {p}" for p in report["problems"]]
    return lines


def read_trust_anchors(explicit: str | None, profile_anchors: str | None) -> str | None:
    path = explicit or profile_anchors
    if not path:
        return None
    from gpufleet.errors import ConfigError

    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read trust anchors {path}: {err.strerror}")


def read_watermark_keys(explicit: str | None, profile_keys: str | None) -> tuple:
    """The watermark keys named by ``--watermark-keys`` or the profile; none when neither names a file."""
    path = explicit or profile_keys
    if not path:
        return ()
    from gpufleet.provenance.keys import load_watermark_keys

    return load_watermark_keys(path)


def verify_file(job_id: str, video: Path, trust_anchors: str | None, expected_payload: str | None,
                watermark_keys: tuple = ()) -> dict[str, Any]:
    """Run :func:`gpufleet.provenance.verify` on a downloaded video and judge it for ``job_id``."""
    from gpufleet.provenance import verify
    from gpufleet.provenance.watermark import payload_hex

    result = verify(video, trust_anchors, watermark_keys)
    return verification_report(job_id, expected_payload or payload_hex(job_id), result)


def run(args: argparse.Namespace) -> int:
    client = make_client(args)
    out = client.output(args.job_id)
    files = client.download_output(args.job_id, args.out_dir, out)
    summary: dict[str, Any] = {"job_id": args.job_id, "files": {k: str(v) for k, v in files.items()}}
    if not args.json:
        for name, path in files.items():
            print(f"wrote {path} ({path.stat().st_size} bytes, {name})")
    if args.no_verify or out.kind == "files":  # a container job's files carry no provenance to verify
        if args.json:
            print_json(summary)
        return EXIT_OK
    anchors = read_trust_anchors(args.trust_anchors, client.profile.trust_anchors)
    wm_keys = read_watermark_keys(args.watermark_keys, client.profile.watermark_keys)
    report = verify_file(args.job_id, files["video"], anchors, out.watermark_payload, wm_keys)
    summary["verification"] = report
    if args.json:
        print_json(summary)
    else:
        print("\n".join(format_report(report)))
    return EXIT_OK if report["ok"] else EXIT_VERIFY_FAILED
