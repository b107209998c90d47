"""The OpenAPI 3.1 document of the administration API, generated from its routes and pydantic models.

``python -m gpufleet.adminapi.openapi`` prints it; ``--write`` updates docs/openapi-admin.json; ``--check``
exits 1 when the committed copy is stale (tests/unit/adminapi runs the same check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi-admin.json"


def document() -> dict[str, Any]:
    """Build the document without any AWS access (the app is never invoked)."""
    from gpufleet.adminapi.app import AdminApi
    from gpufleet.adminapi.service import AdminDeps, AdminService
    from gpufleet.clock import FakeClock
    from gpufleet.store.fakes.admin import MemoryAdminStore

    api = AdminApi(AdminService(AdminDeps(store=MemoryAdminStore(), clock=FakeClock())), lambda arn: None)
    doc = api.openapi()
    comps = doc.setdefault("components", {})
    comps.setdefault("securitySchemes", {})["sigv4"] = {
        "type": "apiKey", "name": "Authorization", "in": "header",
        "description": "AWS Signature Version 4 (API Gateway AWS_IAM authorization); admin principals only",
        "x-amazon-apigateway-authtype": "awsSigv4",
    }
    doc["security"] = [{"sigv4": []}]
    for ops in doc.get("paths", {}).values():  # request validation answers 400 here, never 422
        for op in ops.values():
            op.get("responses", {}).pop("422", None)
    comps.get("schemas", {}).pop("HTTPValidationError", None)
    comps.get("schemas", {}).pop("ValidationError", None)
    return doc


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.adminapi.openapi")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {DOC_PATH}")
    g.add_argument("--check", action="store_true", help="fail if the committed copy is stale")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
        return 0
    if args.check:
        if (DOC_PATH.read_text() if DOC_PATH.exists() else "") != text:
            print(f"{DOC_PATH} is stale: run `python -m gpufleet.adminapi.openapi --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
