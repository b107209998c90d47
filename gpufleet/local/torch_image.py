"""A tenant image with Python and CPU torch, built from this host's files without any registry (gang tests, demos).

Contract:
- :func:`sources` is what goes in (image path -> host file): the tools image's files
  (:func:`gpufleet.local.oci_image.sources`: ``dash``, a few coreutils, the distribution's ``python3`` and the
  shared libraries they load), the distribution's whole standard library (``/usr/lib/python3.11`` less its
  tests, ``idlelib``, ``tkinter``, ``ensurepip``, ``lib2to3``, ``config-*``), the packages ``torch`` imports
  from the virtualenv that holds it — ``torch`` (less its C++ headers, its tests, its ``bin`` but ``torch_shm_manager``
  and its test libraries), ``torchgen``, ``numpy``, ``numpy.libs``, ``typing_extensions`` — at ``/usr/local/lib/python3.11/dist-packages``
  (on the distribution interpreter's path), every system library their extension modules load (``ldd``),
  and the caller's ``app`` files (e.g. ``/app/allreduce.py``). Nothing is downloaded; the distribution's
  3.11 interpreter loads the virtualenv's cp311 wheels.
- :func:`ensure_image` writes those files straight into a tar (no copied rootfs folder: the host files are
  read once) and imports it with ``podman import`` as ``tag``, labelled with a fingerprint of the file list
  (paths, sizes, mtimes, modes; the app files by content) and the builder version; an image whose label matches is reused, so a
  machine builds it once (about 650 MB, most of it ``libtorch_cpu.so``). Returns the image id.
- ``python -m gpufleet.local.torch_image`` (:func:`main`) builds it with the gang example
  (``docs/examples/gang_allreduce.py`` as ``/app/allreduce.py``, :data:`EXAMPLE_APP`) in the store of the user
  that runs podman for ``gpufleet dev`` and the tests.
- :func:`unavailable` says why it cannot be built here (no tools image prerequisites, no torch, a torch
  that is not for this interpreter's ABI), or None.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from gpufleet.local import oci_image
from gpufleet.runtime.oci import Podman, stderr_reason

TORCH_IMAGE = "localhost/gpufleet-test/torch-cpu:1"
BUILDER_VERSION = "1"
STDLIB = Path("/usr/lib/python3.11")
SITE_DEST = "/usr/local/lib/python3.11/dist-packages"
#: top-level entries of the virtualenv's site-packages that ``import torch`` (and gloo's init) load
PACKAGES = ("torch", "torchgen", "numpy", "numpy.libs", "typing_extensions.py")
_STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "pydoc_data",
    "__phello__",
}
_TORCH_SKIP = {"include", "test", "bin", "share"}
_TORCH_LIB_SKIP = (
    "libjitbackend_test.so",
    "libtorchbind_test.so",
    "libbackend_with_compiler.so",
    "libaoti_custom_ops.so",
)


def site_packages() -> Path | None:
    """The site-packages folder holding this interpreter's torch (without importing it), or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def unavailable() -> str | None:
    reason = oci_image.available()
    if reason:
        return reason
    if not STDLIB.is_dir():
        return f"{STDLIB} (the distribution's standard library) is missing"
    site = site_packages()
    if site is None:
        return "torch is not installed in this interpreter"
    if sys.version_info[:2] != (3, 11):
        return f"torch here is for Python {sys.version_info[0]}.{sys.version_info[1]}; the image's python3 is 3.11"
    return None


def _walk(root: Path, dest: str, skip_dirs: set[str], skip_files: tuple[str, ...] = ()) -> dict[str, str]:
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        dirs[:] = sorted(d for d in dirs if not (rel == Path(".") and d in skip_dirs))
        for name in files:
            if name.endswith((".a", ".h", ".hpp")) or name in skip_files:
                continue
            src = Path(folder) / name
            if src.is_symlink() and not src.exists():
                continue
            out[f"{dest}/{(rel / name).as_posix()}".replace("/./", "/")] = str(src)
    return out


def sources(app: dict[str, Path] | None = None) -> dict[str, str]:
    """Image path -> host file (see module)."""
    site = site_packages()
    if site is None:
        raise RuntimeError("torch is not installed in this interpreter")
    files = oci_image.sources()
    files.update(_walk(STDLIB, str(STDLIB), _STDLIB_SKIP))
    for name in PACKAGES:
        src = site / name
        if src.is_file():
            files[f"{SITE_DEST}/{name}"] = str(src)
        elif src.is_dir():
            skip = _TORCH_SKIP if name == "torch" else set()
            files.update(_walk(src, f"{SITE_DEST}/{name}", skip, _TORCH_LIB_SKIP if name == "torch" else ()))
    shm = site / "torch" / "bin" / "torch_shm_manager"  # torch's import checks it is there
    if shm.is_file():
        files[f"{SITE_DEST}/torch/bin/torch_shm_manager"] = str(shm)
    site_prefix = str(site) + os.sep
    for src in {s for s in files.values() if ".so" in Path(s).name}:
        for lib in oci_image.shared_libraries(src):
            if not lib.startswith(site_prefix):  # the packages' own libraries are there already ($ORIGIN)
                files[lib] = os.path.realpath(lib)
    for dest, src in (app or {}).items():
        files[dest] = str(src)
    return files


def fingerprint(files: dict[str, str], by_content: frozenset[str] = frozenset()) -> str:
    """A digest of the image's files: path, size, mtime and mode of each host file, and the content (not the
    host path or mtime) of the ``by_content`` ones — the caller's app files, which a checkout or a rebase
    touches and another worktree holds at another path."""
    h = hashlib.sha256(f"torch builder {BUILDER_VERSION}\n".encode())
    for dest, src in sorted(files.items()):
        st = os.stat(src)
        if dest in by_content:
            h.update(f"{dest} {hashlib.sha256(Path(src).read_bytes()).hexdigest()} {st.st_mode & 0o111:o}\n".encode())
        else:
            h.update(f"{dest} {src} {st.st_size} {st.st_mtime_ns} {st.st_mode:o}\n".encode())
    return h.hexdigest()


def write_tar(path: Path, files: dict[str, str]) -> None:
    """A rootfs tar of ``files`` (root-owned, world-readable), with every parent folder and the base folders."""
    folders = {"/tmp", "/job", "/proc", "/sys", "/dev", "/etc"}
    for dest in files:
        folders.update(str(p) for p in Path(dest).parents if str(p) != "/")
    with tarfile.open(path, "w") as tar:
        for d in sorted(folders):
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "/tmp" else 0o755
            tar.addfile(info)
        for name, text in (("etc/passwd", oci_image.PASSWD), ("etc/group", oci_image.GROUP)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, _bytes(data))
        for dest, src in sorted(files.items()):
            st = os.stat(src)
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size, info.mode, info.mtime = st.st_size, (st.st_mode & 0o7777) | 0o444, int(st.st_mtime)
            with open(src, "rb") as fh:
                tar.addfile(info, fh)


def _bytes(data: bytes):
    import io

    return io.BytesIO(data)


def ensure_image(podman: Podman, tag: str = TORCH_IMAGE, app: dict[str, Path] | None = None) -> str:
    """The id of ``tag`` in ``podman``'s store, built from the host's files when missing or stale."""
    files = sources(app)
    fp = fingerprint(files, frozenset(app or ()))
    got = podman.run(
        "image", "inspect", "--format", f'{{{{index .Labels "{oci_image.FINGERPRINT_LABEL}"}}}}', tag, check=False
    )
    if got.returncode == 0 and got.stdout.decode().strip() == fp:
        return podman.image_id(tag) or ""
    with tempfile.TemporaryDirectory(prefix="gpufleet-torch-image-") as tmp:
        archive = Path(tmp) / "rootfs.tar"
        write_tar(archive, files)
        args = (
            "import",
            "--change",
            f"LABEL {oci_image.FINGERPRINT_LABEL}={fp}",
            "--change",
            "ENV PATH=/usr/bin:/bin",
            "--change",
            "ENV LANG=C.UTF-8",
            "-",
            tag,
        )
        for attempt in (1, 2):  # a store's first-time set-up racing another import: once more
            with open(archive, "rb") as fh:
                proc = podman.popen(*args, stdin=fh, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                _out, err = proc.communicate(timeout=600)
            if proc.returncode == 0:
                break
            if attempt == 2:
                raise RuntimeError(f"podman import of {tag} failed: {stderr_reason(err)}")
            time.sleep(2)
    image = podman.image_id(tag)
    if not image:
        raise RuntimeError(f"podman import did not create {tag}")
    return image


#: the gang example (docs/agent.md, "Writing a gang job") as the image's ``/app/allreduce.py``
EXAMPLE_APP = {"/app/allreduce.py": Path(__file__).resolve().parents[2] / "docs" / "examples" / "gang_allreduce.py"}


def main() -> int:
    """``python -m gpufleet.local.torch_image``: build (or reuse) :data:`TORCH_IMAGE` with the gang example in the
    local podman user's store (what ``gpufleet dev``'s agents run), print its id."""
    reason = oci_image.local_oci_unavailable() or unavailable()
    if reason:
        print(f"cannot build {TORCH_IMAGE}: {reason}", file=sys.stderr)
        return 1
    print(f"{TORCH_IMAGE} {ensure_image(Podman(user=oci_image.local_oci_user()), app=EXAMPLE_APP)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
