"""``gpufleet admin models``: the model catalog (which models jobs may name, each with the content hash they run) and
the published models behind it.

- ``publish FOLDER --name NAME [--root s3://bucket/models/]`` uploads a ``WanPipeline`` folder (it must hold
  ``model_index.json``) and its manifest with :func:`gpufleet.models.loader.publish_model` under ``<root><name>/``,
  then registers it in the catalog through the administration API (``PUT /v1/admin/models/{name}``: the server reads
  the manifest it was just given and records its SHA-256, the model's content hash); ``--no-register`` uploads only.
- ``register NAME [--content-hash H | --folder PATH]`` registers (or re-registers) a model: without either, the
  published manifest's hash (the server reads it); ``--folder`` computes a folder's hash here
  (:func:`gpufleet.models.loader.folder_sha256`) for a model on the nodes' local model roots (never published).
- ``remove NAME`` deregisters the model first (jobs naming it are refused from then on), then deletes its manifest
  and then its files (from then on a job's loader finds no model, never half of one); the bucket is versioned, so the
  removed objects stay recoverable until its lifecycle expires them (30 days). Without ``--root`` only the catalog
  entry goes.
- ``list`` shows the catalog merged with what is published: name, registered hash, published hash and state
  (``registered``, ``not registered``: published only, ``differs``: the catalog names other content than the bucket
  holds, ``local``: registered, not published).

``--root`` defaults to ``$GPUFLEET_MODEL_S3_ROOT``; a deployment's is its stack output ``ModelsRoot``
(``s3://<models bucket>/models/``). Jobs name the model in ``workload.model``. Uploads and deletions use the
operator's own AWS credentials (the gpufleet profile's with ``--profile``, else botocore's chain): no role of the
deployment may write the models bucket (docs/security.md); catalog changes are signed requests to the administration
API (``--profile``/``--endpoint``, admin principals only, audited). Bad input (a missing folder, no
``model_index.json``, a name a job could not name, a root that is not ``s3://bucket/prefix/``, a hash that is not 64
lower-case hex) is a one-line error and exit 1, before anything is uploaded or registered.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gpufleet.cli.common import EXIT_OK, add_json_arg, make_client, operator_client, print_json, table
from gpufleet.errors import NotFound, ValidationFailed
from gpufleet.models.catalog import is_hash, name_problem

_ROOT = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^*?]+/)+$")


CATALOG = "/v1/admin/models"


def register(asub: argparse._SubParsersAction) -> None:
    group = asub.add_parser("models", help="the model catalog and the published models",
                            description="the models jobs may name (the catalog, administration API) and the published "
                            "models behind them (the models bucket, your own AWS credentials)")
    msub = group.add_subparsers(dest="models_command", required=True)
    text = ("upload a model folder (WanPipeline, with model_index.json) and its manifest under ROOT/NAME/ with your own "
            "AWS credentials (no deployment role may write the models bucket), then register it in the model catalog")
    p = msub.add_parser("publish", help="publish a model folder and register it for jobs to name", description=text)
    p.add_argument("folder", metavar="FOLDER", help="the model folder (WanPipeline.save_pretrained output)")
    p.add_argument("--name", required=True, help="the name jobs give in workload.model")
    p.add_argument("--no-register", action="store_true", help="upload only; register later (models register NAME)")
    _common(p)
    p.set_defaults(func=run_publish)
    p = msub.add_parser("register", help="register a model in the catalog (or replace its hash)",
                        description="register NAME: the published manifest's hash (the server reads it), or the hash "
                        "given, or that of a local folder (a model on the nodes' local model roots)")
    p.add_argument("name", metavar="NAME", help="the name jobs give in workload.model")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--content-hash", metavar="H", help="the model's content hash (64 lower-case hex)")
    how.add_argument("--folder", metavar="PATH", help="compute the hash of this model folder here (as the nodes' "
                     "local model roots hold it)")
    _api_args(p)
    p.set_defaults(func=run_register)
    p = msub.add_parser("list", help="the catalog and the published models: hashes and state",
                        description="the model catalog merged with the models published under ROOT")
    _common(p)
    p.set_defaults(func=run_list)
    p = msub.add_parser("remove", help="deregister a model, then take its published files back",
                        description="deregister NAME (jobs naming it are refused from then on), then remove ROOT/NAME/: "
                        "the manifest first, then the files (the versioned bucket keeps them recoverable for 30 days)")
    p.add_argument("name", metavar="NAME", help="the model's name")
    _common(p)
    p.set_defaults(func=run_remove)


def _api_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="FILE", help="gpufleet profile file: the administration API's endpoint, region "
                   "and credentials (also for S3)")
    p.add_argument("--endpoint", metavar="URL", help="API endpoint (overrides the profile)")
    add_json_arg(p)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=os.environ.get("GPUFLEET_MODEL_S3_ROOT"),
                   help="s3://bucket/prefix/ of the published models (default: $GPUFLEET_MODEL_S3_ROOT; a "
                   "deployment's is its stack output ModelsRoot)")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="AWS region (default: the profile's, then $AWS_REGION)")
    _api_args(p)


def checked_root(root: str | None) -> str:
    """The models root, or ValidationFailed saying what is wrong."""
    if not root:
        raise ValidationFailed("no models root: give --root s3://bucket/models/ (the stack output ModelsRoot) or set "
                               "GPUFLEET_MODEL_S3_ROOT")
    if not _ROOT.match(root):
        raise ValidationFailed(f"--root must be s3://bucket/prefix/ (ending in /), got {root!r}")
    return root


def checked_name(name: str, *, registering: bool = True) -> str:
    """A name a job can give in ``workload.model`` (and, ``registering``, not the built-in model), or
    ValidationFailed."""
    problem = name_problem(name, registering=registering)
    if problem:
        raise ValidationFailed(problem if "built in" in problem else f"--name {problem}")
    return name


def checked(folder: str, name: str, root: str | None) -> tuple[Path, str, str]:
    """The folder, name and root to publish, or ValidationFailed saying what is wrong (pure but for the folder's
    existence)."""
    root, name = checked_root(root), checked_name(name)
    return _model_folder(folder), name, root


def _model_folder(folder: str) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise ValidationFailed(f"model folder {folder} does not exist")
    if not (path / "model_index.json").is_file():
        raise ValidationFailed(f"{folder} is not a model folder: it has no model_index.json")
    return path


def _path(name: str) -> str:
    return f"{CATALOG}/{quote(name, safe='')}"


def _register(client, name: str, content_hash: str | None) -> dict[str, Any]:
    body = {"content_hash": content_hash} if content_hash else {}
    return dict(client.request("PUT", _path(name), body=body).body)


def run_publish(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import folder_manifest, publish_model
    from gpufleet.store.objectstore import ObjectStore

    folder, name, root = checked(args.folder, args.name, args.root)
    api = None if args.no_register else make_client(args)  # a missing API profile fails before any upload
    files = folder_manifest(folder)["files"]
    size = sum((folder / rel).stat().st_size for rel in files)
    store = ObjectStore(operator_client(args, "s3", args.s3_endpoint))
    digest = publish_model(folder, store, root, name)
    out: dict[str, Any] = {"name": name, "uri": f"{root}{name}/", "content_hash": digest, "files": len(files),
                           "bytes": size}
    if api is not None:
        out["registered"] = _register(api, name, digest)
    if args.json:
        print_json(out)
    else:
        print(f"published {name}: sha256 {digest} ({len(files)} files, {size} bytes) at {out['uri']}")
        if api is not None:
            print(f"registered {name} in the model catalog (version {out['registered'].get('version')}): jobs may "
                  "name it")
        else:
            print(f"not registered: jobs may name it once registered (gpufleet admin models register {name})")
    return EXIT_OK


def run_register(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import folder_sha256

    name = checked_name(args.name)
    digest = args.content_hash
    if digest is not None and not is_hash(digest):
        raise ValidationFailed(f"--content-hash must be 64 lower-case hex digits (a SHA-256), got {digest!r}")
    if args.folder:
        digest = folder_sha256(_model_folder(args.folder))
    entry = _register(make_client(args), name, digest)
    if args.json:
        print_json(entry)
    else:
        print(f"registered {name}: sha256 {entry.get('content_hash')} ({entry.get('source')}, version "
              f"{entry.get('version')})")
    return EXIT_OK


def catalog_state(registered: str | None, published: str | None) -> str:
    """A model's state in ``list`` (pure)."""
    if registered is None:
        return "not registered"
    if published is None:
        return "local"
    return "registered" if registered == published else "differs"


def merged(entries: list[dict[str, Any]], published: list[Any], root: str) -> list[dict[str, Any]]:
    """The catalog entries and published models, one row per name, sorted (pure)."""
    by_name = {e["name"]: e for e in entries}
    pub = {m.name: m for m in published}
    rows = []
    for name in sorted(set(by_name) | set(pub)):
        entry, model = by_name.get(name), pub.get(name)
        registered = entry.get("content_hash") if entry else None
        published_hash = model.content_hash if model else None
        rows.append({"name": name, "state": catalog_state(registered, published_hash), "registered_hash": registered,
                     "published_hash": published_hash, "content_hash": published_hash or registered,
                     "uri": f"{root}{name}/" if model else None, "files": model.files if model else entry.get("files"),
                     "bytes": model.bytes if model else entry.get("bytes"),
                     "version": entry.get("version") if entry else None})
    return rows


def run_list(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import published_models
    from gpufleet.store.objectstore import ObjectStore

    root = checked_root(args.root)
    entries = list(make_client(args).request("GET", CATALOG).body.get("items") or [])
    rows = merged(entries, published_models(ObjectStore(operator_client(args, "s3", args.s3_endpoint)), root), root)
    if args.json:
        print_json(rows)
    elif not rows:
        print(f"no models registered or published under {root}")
    else:
        print(table([[r["name"], r["state"], r["registered_hash"] or "-", r["published_hash"] or "-",
                      str(r["files"] if r["files"] is not None else ""), str(r["bytes"] if r["bytes"] is not None
                                                                               else "")] for r in rows],
                    ["NAME", "STATE", "REGISTERED SHA-256", "PUBLISHED SHA-256", "FILES", "BYTES"]))
    return EXIT_OK


def run_remove(args: argparse.Namespace) -> int:
    from gpufleet.models.loader import unpublish_model
    from gpufleet.store.objectstore import ObjectStore

    name = checked_name(args.name, registering=False)
    root = checked_root(args.root) if args.root else None
    api = make_client(args)
    try:
        deregistered: dict[str, Any] | None = dict(api.request("DELETE", _path(name)).body)
    except NotFound:
        deregistered = None
    files = None
    if root is not None:
        try:
            files = unpublish_model(ObjectStore(operator_client(args, "s3", args.s3_endpoint)), root, name)
        except NotFound:
            if deregistered is None:
                raise NotFound(f"no model {name!r} is registered or published under {root}")
    elif deregistered is None:
        raise NotFound(f"no model {name!r} is registered (give --root to remove its published files)")
    if args.json:
        print_json({"name": name, "deregistered": deregistered is not None,
                    "uri": f"{root}{name}/" if root else None, "removed_files": files})
        return EXIT_OK
    said = [f"deregistered {name} (jobs naming it are refused from now on)" if deregistered is not None
            else f"{name} was not registered"]
    if files is not None:
        said.append(f"removed its manifest and {files} files under {root}{name}/ (the versioned bucket keeps them "
                    "recoverable until its lifecycle expires them)")
    elif root is not None:
        said.append(f"nothing was published under {root}{name}/")
    else:
        said.append("published files not touched (no --root)")
    print("; ".join(said))
    return EXIT_OK
