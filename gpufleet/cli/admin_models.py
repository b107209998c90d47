"""``gpufleet admin models publish FOLDER --name NAME [--root s3://bucket/models/]``: publish a model for jobs;
``gpufleet admin models list`` and ``gpufleet admin models remove NAME``: what is published, and taking a model back.

Uploads a ``WanPipeline`` folder (it must hold ``model_index.json``) and its manifest with
:func:`gpufleet.models.loader.publish_model` under ``<root><name>/``, then prints the manifest's SHA-256 (the model's
content hash: what nodes cache it under and what an attempt records). ``--root`` defaults to
``$GPUFLEET_MODEL_S3_ROOT``; a deployment's is its stack output ``ModelsRoot`` (``s3://<models bucket>/models/``).
Jobs then name the model in ``workload.model``. The upload uses the operator's own AWS credentials (the gpufleet
profile's with ``--profile``, else botocore's chain): no role of the deployment may write the models bucket
(docs/security.md). Bad input (a missing folder, no ``model_index.json``, a name a job could not name, a root that is
not ``s3://bucket/prefix/``) is a one-line error and exit 1, before anything is uploaded.

``list`` prints each published model's name, content hash, file count and size; ``remove`` deletes the manifest
first (from then on a job naming the model fails to find it, never loads half of it), then its files; the bucket is
versioned, so the removed objects stay recoverable until its lifecycle expires them (30 days). Nodes and instances
that cached the model keep their copy until their caches evict it; jobs still resolve the name through the bucket.
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
    _common(p)
    p.set_defaults(func=run_publish)
    p = msub.add_parser("list", help="the published models: name, content hash, files, bytes",
                        description="list the models published under ROOT")
    _common(p)
    p.set_defaults(func=run_list)
    p = msub.add_parser("remove", help="take a published model back (its manifest first, then its files)",
                        description="remove ROOT/NAME/: the manifest first, then the files (the versioned bucket "
                        "keeps them recoverable for 30 days); jobs naming it then fail to find it")
    p.add_argument("name", metavar="NAME", help="the published model's name")
    _common(p)
    p.set_defaults(func=run_remove)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=os.environ.get("GPUFLEET_MODEL_S3_ROOT"),
                   help="s3://bucket/prefix/ of the published models (default: $GPUFLEET_MODEL_S3_ROOT; a "
                   "deployment's is its stack output ModelsRoot)")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="AWS region (default: the profile's, then $AWS_REGION)")
    p.add_argument("--profile", metavar="FILE", help="gpufleet profile file for region and credentials")
    add_json_arg(p)


def checked_root(root: str | None) -> str:
    """The models root, or ValidationFailed saying what is wrong."""
    if not root:
        raise ValidationFailed("no models root: give --root s3://bucket/models/ (the stack output ModelsRoot) or set "
                               "GPUFLEET_MODEL_S3_ROOT")
    if not _ROOT.match(root):
        raise ValidationFailed(f"--root must be s3://bucket/prefix/ (ending in /), got {root!r}")
    return root


def checked_name(name: str) -> str:
    """A name a job can give in ``workload.model``, or ValidationFailed."""
    if not name or "/" in name or name.startswith(".") or len(name) > int(LIMITS["model_max_chars"]) \
            or not name.isprintable() or name.strip() != name:
        raise ValidationFailed(f"--name {name!r} cannot name a model (no '/', no leading '.', at most "
                               f"{LIMITS['model_max_chars']} printable characters)")
    return name


def checked(folder: str, name: str, root: str | None) -> tuple[Path, str, str]:
    """The folder, name and root to publish, or ValidationFailed saying what is wrong (pure but for the folder's
    existence)."""
    root, name = checked_root(root), checked_name(name)
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


def run_list(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import published_models
    from gpufleet.store.objectstore import ObjectStore

    root = checked_root(args.root)
    models = published_models(ObjectStore(operator_client(args, "s3", args.s3_endpoint)), root)
    if args.json:
        print_json([{"name": m.name, "uri": f"{root}{m.name}/", "content_hash": m.content_hash, "files": m.files,
                     "bytes": m.bytes} for m in models])
    elif not models:
        print(f"no models published under {root}")
    else:
        width = max(len(m.name) for m in models)
        print(f"{'NAME'.ljust(width)}  {'CONTENT SHA-256'.ljust(64)}  FILES  BYTES")
        for m in models:
            print(f"{m.name.ljust(width)}  {m.content_hash}  {m.files:5d}  {m.bytes}")
    return EXIT_OK


def run_remove(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import unpublish_model
    from gpufleet.store.objectstore import ObjectStore

    root, name = checked_root(args.root), checked_name(args.name)
    files = unpublish_model(ObjectStore(operator_client(args, "s3", args.s3_endpoint)), root, name)
    if args.json:
        print_json({"name": name, "uri": f"{root}{name}/", "removed_files": files})
    else:
        print(f"removed {name}: its manifest and {files} files under {root}{name}/ (the versioned bucket keeps them "
              "recoverable until its lifecycle expires them)")
    return EXIT_OK
