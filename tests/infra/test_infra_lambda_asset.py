"""The Lambda asset is complete: every handler imports with only the asset and what the Lambda runtime provides."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

from wheels import glibc_needed, wheel_tags

from infra.config import ALL_FUNCTIONS
from infra.functions import LAMBDA_RUNTIME
from infra.lambda_asset import RUNTIME_PROVIDED, build_lambda_asset, dependency_closure


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


#: glibc of the Amazon Linux release under each Lambda Python runtime (python3.11: Amazon Linux 2;
#: python3.12 and later: Amazon Linux 2023)
LAMBDA_GLIBC = {"python3.11": (2, 26), "python3.12": (2, 34), "python3.13": (2, 34)}


def test_every_bundled_wheel_loads_on_the_lambda_runtimes_glibc():
    """The zip asset copies this interpreter's binary wheels: each must install on the glibc of the
    runtime the functions declare (numpy 2.3+ wheels need glibc 2.27 and would not load on python3.11)."""
    limit = LAMBDA_GLIBC[LAMBDA_RUNTIME.name]
    too_new = {f"{d.metadata['Name']} {d.version}": glibc_needed(wheel_tags(d)) for d in dependency_closure()}
    too_new = {name: need for name, need in too_new.items() if need > limit}
    assert not too_new, f"wheels needing a newer glibc than {LAMBDA_RUNTIME.name}'s {limit}: {too_new}"
