"""The OpenAPI 3.1 document of the API, generated from the routes and pydantic models.

``python -m gpufleet.api.openapi`` prints it; ``--write`` updates docs/openapi.json;
``--check`` exits 1 when the committed copy is stale (tests/unit/api runs the same check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def document() -> dict[str, Any]:
    """Build the document without any AWS access (the app is never invoked)."""
    from gpufleet.api.app import build_openapi
    from gpufleet.api.settings import ApiSettings
    from gpufleet.api.wiring import build_api
    from gpufleet.clock import FakeClock

    settings = ApiSettings.load(env={}, cursor_secret="openapi-generation-only")
    return build_openapi(build_api(settings, ddb=None, clock=FakeClock()).app)


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufleet.api.openapi")
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
        current = DOC_PATH.read_text() if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is stale: run `python -m gpufleet.api.openapi --write`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
