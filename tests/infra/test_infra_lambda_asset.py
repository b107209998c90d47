"""The Lambda asset is complete: every handler imports with only the asset and what the Lambda runtime provides."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

from infra.config import ALL_FUNCTIONS
from infra.lambda_asset import RUNTIME_PROVIDED, build_lambda_asset


def _runtime_site(tmp: Path) -> Path:
    """A site dir holding only the packages the Lambda Python runtime ships (boto3 and its dependencies)."""
    for name in RUNTIME_PROVIDED:
        dist = md.distribution(name)
        tops = {str(f).split("/")[0] for f in dist.files or [] if ".dist-info" not in str(f)}
        for top in tops - {"..", "bin"}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (tmp / top).exists():
                os.symlink(src, tmp / top)
    return tmp


def test_every_handler_imports_from_the_asset_alone(tmp_path):
    asset = build_lambda_asset()
    site = _runtime_site(tmp_path)
    modules = sorted({f.handler.rsplit(".", 1)[0] for f in ALL_FUNCTIONS})
    script = (
        f"import sys; sys.path[:0] = [{str(asset)!r}, {str(site)!r}]\n"
        "import importlib\n"
        f"for m in {modules!r}:\n"
        "    mod = importlib.import_module(m)\n"
        "    assert mod.__file__.startswith(sys.path[0]), mod.__file__\n"
        "    assert callable(mod.handler)\n"
    )
    # -I -S: no user site, no site-packages; only the standard library, the asset and the runtime's packages.
    run = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (asset / "gpufleet" / "local").exists()  # the harness never ships
