"""``gpufleet admin models publish FOLDER --name NAME [--root s3://bucket/models/]``: publish a model for jobs.

Uploads a ``WanPipeline`` folder (it must hold ``model_index.json``) and its manifest with
:func:`gpufleet.models.loader.publish_model` under ``<root><name>/``, then prints the manifest's SHA-256 (the model's
content hash: what nodes cache it under and what an attempt records). ``--root`` defaults to
``$GPUFLEET_MODEL_S3_ROOT``; a deployment's is its stack output ``ModelsRoot`` (``s3://<models bucket>/models/``).
Jobs then name the model in ``workload.model``. The upload uses the operator's own AWS credentials (the gpufleet
profile's with ``--profile``, else botocore's chain): no role of the deployment may write the models bucket
(docs/security.md). Bad input (a missing folder, no ``model_index.json``, a name a job could not name, a root that is
not ``s3://bucket/prefix/``) is a one-line error and exit 1, before anything is uploaded.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from gpufleet.cli.common import EXIT_OK, add_json_arg, operator_client, print_json
from gpufleet.errors import ValidationFailed
from gpufleet.spec import LIMITS

_ROOT = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^*?]+/)+$")


def register(asub: argparse._SubParsersAction) -> None:
    group = asub.add_parser("models", help="published models (S3, your own AWS credentials)",
                            description="models jobs load from the deployment's models bucket")
    msub = group.add_subparsers(dest="models_command", required=True)
    text = ("upload a model folder (WanPipeline, with model_index.json) and its manifest under ROOT/NAME/ and print "
            "its content hash; uses your own AWS credentials (no deployment role may write the models bucket)")
    p = msub.add_parser("publish", help="publish a model folder for jobs to load", description=text)
    p.add_argument("folder", metavar="FOLDER", help="the model folder (WanPipeline.save_pretrained output)")
    p.add_argument("--name", required=True, help="the name jobs give in workload.model")
    p.add_argument("--root", default=os.environ.get("GPUFLEET_MODEL_S3_ROOT"),
                   help="s3://bucket/prefix/ of the published models (default: $GPUFLEET_MODEL_S3_ROOT; a "
                   "deployment's is its stack output ModelsRoot)")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="AWS region (default: the profile's, then $AWS_REGION)")
    p.add_argument("--profile", metavar="FILE", help="gpufleet profile file for region and credentials")
    add_json_arg(p)
    p.set_defaults(func=run_publish)


def checked(folder: str, name: str, root: str | None) -> tuple[Path, str, str]:
    """The folder, name and root to publish, or ValidationFailed saying what is wrong (pure but for the folder's
    existence)."""
    if not root:
        raise ValidationFailed("no models root: give --root s3://bucket/models/ (the stack output ModelsRoot) or set "
                               "GPUFLEET_MODEL_S3_ROOT")
    if not _ROOT.match(root):
        raise ValidationFailed(f"--root must be s3://bucket/prefix/ (ending in /), got {root!r}")
    if not name or "/" in name or name.startswith(".") or len(name) > int(LIMITS["model_max_chars"]) \
            or not name.isprintable() or name.strip() != name:
        raise ValidationFailed(f"--name {name!r} cannot name a model (no '/', no leading '.', at most "
                               f"{LIMITS['model_max_chars']} printable characters)")
    path = Path(folder)
    if not path.is_dir():
        raise ValidationFailed(f"model folder {folder} does not exist")
    if not (path / "model_index.json").is_file():
        raise ValidationFailed(f"{folder} is not a model folder: it has no model_index.json")
    return path, name, root


def run_publish(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import folder_manifest, publish_model
    from gpufleet.store.objectstore import ObjectStore

    folder, name, root = checked(args.folder, args.name, args.root)
    files = folder_manifest(folder)["files"]
    size = sum((folder / rel).stat().st_size for rel in files)
    store = ObjectStore(operator_client(args, "s3", args.s3_endpoint))
    digest = publish_model(folder, store, root, name)
    out = {"name": name, "uri": f"{root}{name}/", "content_hash": digest, "files": len(files), "bytes": size}
    if args.json:
        print_json(out)
    else:
        print(f"published {name}: sha256 {digest} ({len(files)} files, {size} bytes) at {out['uri']}")
    return EXIT_OK
