"""The web console's files: a single page of plain ES modules (no framework, no build step, no third-party
code) that signs its ``/v1`` requests with SigV4 in the browser (docs/console.md). Served locally by
:mod:`gpufleet.devstack.webconsole`; in AWS from a private S3 bucket behind CloudFront (infra/console.py).

:func:`csp` is the page's Content-Security-Policy, the same in both places; :func:`site` is the files' layout
under the site's root (``index.html`` at the root, everything else under ``assets/``), the same in both places.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: the console's files (index.html, *.js, *.css)
ASSETS = Path(__file__).resolve().parent
#: where the page reads its configuration (region, signing service, and in AWS the sign-in's endpoints)
CONFIG_KEY = "console/config.json"


def site() -> dict[str, Path]:
    """The console's files by their key under the site's root: ``index.html`` and ``assets/<name>`` for every
    script and style sheet."""
    files = {"index.html": ASSETS / "index.html"}
    for path in sorted(ASSETS.iterdir()):
        if path.suffix in (".js", ".css"):
            files[f"assets/{path.name}"] = path
    return files


def csp(media_origins: Iterable[str] = (), connect_origins: Iterable[str] = ()) -> str:
    """The console's Content-Security-Policy: scripts and styles from the page's origin only, no inline code,
    API calls to the page's origin plus ``connect_origins`` (in AWS: the API and Cognito), media also from
    ``media_origins`` (where presigned output links point), never framed."""
    media = " ".join(["'self'", "blob:", *media_origins])
    connect = " ".join(["'self'", *connect_origins])
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"media-src {media}; connect-src {connect}; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
