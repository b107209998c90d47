"""Build a tiny OCI image from the host's own distribution files, without any registry (tests, demos).

Contract:
- :func:`build_rootfs` copies into a folder: ``dash`` as ``/bin/sh``, a few coreutils, the
  distribution's ``python3`` (``/usr/bin/python3``, not a virtualenv) with the standard-library
  modules that :data:`PY_MODULES` need, and every shared library they load (``ldd``), at the
  paths the host uses. Nothing is downloaded.
- :func:`ensure_image` imports that folder with ``podman import`` as ``tag`` (default
  :data:`TOOLS_IMAGE`) into the store of the given :class:`gpufleet.runtime.oci.Podman` (so the
  rootless user's), labelled with a fingerprint of its content: an image whose label matches is
  reused, so a test session builds it at most once (and usually not at all). Returns the image id.
  :func:`pinned_ref` names an image in a store by its repository and manifest digest
  (``localhost/gpufleet-test/tools@sha256:...``), as cloud container jobs must (a tag-only image runs on-prem
  only: gpufleet.api.admission).
- :func:`available` says why an image cannot be built here (no podman, no distribution python),
  or None; :func:`local_oci_unavailable` adds the rootless user a root process needs and
  :func:`rootless_unavailable`, which asks podman itself whether it can run rootless here.
- :func:`prepare_local` is what tests and local stacks call: the image in the store of the user
  that runs podman here (:data:`LOCAL_OCI_USER` when this process is root, else this user) and a
  jobs directory that user can reach, as :class:`LocalOci` (runtime settings included: the podman user, the
  jobs directory, and ``gang_network`` ``local``, since every agent of a local stack is on this host).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.runtime.oci import Podman, stderr_reason

TOOLS_IMAGE = "localhost/gpufleet-test/tools:1"
FINGERPRINT_LABEL = "org.gpufleet.fingerprint"
BUILDER_VERSION = "1"
HOST_PYTHON = "/usr/bin/python3"
COMMANDS = ("cat", "ls", "id", "sleep", "env", "mkdir", "rm", "touch", "chmod", "stat", "head", "true", "false")
PY_MODULES = ("json", "os", "signal", "socket", "sys", "time", "errno", "struct", "select", "pathlib", "hashlib",
              "encodings.idna")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
_LDD = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def available() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (make tools)"
    if not os.access(HOST_PYTHON, os.X_OK):
        return f"{HOST_PYTHON} (the distribution's python3) is missing"
    if not shutil.which("ldd") or not shutil.which("dash"):
        return "ldd or dash is missing"
    return None


def shared_libraries(path: str) -> set[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    return {m.group(1) for m in _LDD.finditer(out.stdout)} if out.returncode == 0 else set()


def _python_files() -> set[str]:
    """The standard-library files (and extension modules) the host python loads for PY_MODULES."""
    code = (
        "import importlib.util, json, sys, encodings, os\n"
        f"for m in {list(PY_MODULES)!r}: __import__(m)\n"
        "files = set()\n"
        "for mod in list(sys.modules.values()):\n"
        "    f = getattr(mod, '__file__', None)\n"
        "    if f and f.startswith(sys.base_prefix):\n"
        "        files.add(f)\n"
        "        try:\n"
        "            c = importlib.util.cache_from_source(f)\n"
        "            if os.path.exists(c): files.add(c)\n"
        "        except ValueError: pass\n"
        "enc = os.path.dirname(encodings.__file__)\n"
        "files.update(os.path.join(enc, n) for n in os.listdir(enc) if n.endswith('.py'))\n"
        "print(json.dumps(sorted(files)))\n"
    )
    out = subprocess.run([HOST_PYTHON, "-I", "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def sources() -> dict[str, str]:
    """rootfs path -> host file to copy there."""
    files: dict[str, str] = {}
    dash = os.path.realpath(shutil.which("dash"))
    for p in ("/bin/sh", "/usr/bin/sh", "/usr/bin/dash"):
        files[p] = dash
    for cmd in COMMANDS:
        found = shutil.which(cmd, path="/usr/bin:/bin")
        if found:
            files[f"/usr/bin/{cmd}"] = os.path.realpath(found)
    py = os.path.realpath(HOST_PYTHON)
    files["/usr/bin/python3"] = py
    for f in _python_files():
        files[f] = f
    for src in list(files.values()):
        if src.endswith(".so") or os.access(src, os.X_OK) and not src.endswith((".py", ".pyc")):
            for lib in shared_libraries(src):
                files[lib] = os.path.realpath(lib)
    return files


def _fingerprint(files: dict[str, str]) -> str:
    h = hashlib.sha256(f"builder {BUILDER_VERSION}\n".encode())
    for dest, src in sorted(files.items()):
        st = os.stat(src)
        h.update(f"{dest} {src} {st.st_size} {st.st_mtime_ns} {st.st_mode:o}\n".encode())
    return h.hexdigest()


def build_rootfs(dest: Path, files: dict[str, str] | None = None) -> None:
    files = files or sources()
    for d in ("tmp", "job", "proc", "sys", "dev", "etc"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "etc" / "passwd").write_text(PASSWD)
    (dest / "etc" / "group").write_text(GROUP)
    for target, src in files.items():
        out = dest / target.lstrip("/")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


def ensure_image(podman: Podman, tag: str = TOOLS_IMAGE) -> str:
    """The id of ``tag`` in ``podman``'s store, built from the host's files when missing or stale."""
    files = sources()
    fp = _fingerprint(files)
    got = podman.run("image", "inspect", "--format", f'{{{{index .Labels "{FINGERPRINT_LABEL}"}}}}', tag,
                     check=False)
    if got.returncode == 0 and got.stdout.decode().strip() == fp:
        return podman.image_id(tag) or ""
    with tempfile.TemporaryDirectory(prefix="gpufleet-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        build_rootfs(root, files)
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        args = ("import", "--change", f"LABEL {FINGERPRINT_LABEL}={fp}", "--change", "ENV PATH=/usr/bin:/bin",
                "--change", "ENV LANG=C.UTF-8", "-", tag)
        data = archive.read_bytes()
        # two processes building into a new store at once can trip over its first-time set-up: once more
        if podman.run(*args, input=data, timeout=300, check=False).returncode != 0:
            time.sleep(2)
            podman.run(*args, input=data, timeout=300)
    image = podman.image_id(tag)
    if not image:
        raise RuntimeError(f"podman import did not create {tag}")
    return image


def pinned_ref(podman: Podman, tag: str = TOOLS_IMAGE) -> str:
    """``<repository>@sha256:<digest>`` of ``tag`` in ``podman``'s store (its manifest digest: podman runs it)."""
    got = podman.run("image", "inspect", "--format", "{{.Digest}}", tag, check=False)
    digest = got.stdout.decode().strip() if got.returncode == 0 else ""
    if not digest.startswith("sha256:"):
        raise RuntimeError(f"{tag} has no digest in the store ({stderr_reason(got.stderr)})")
    return f"{tag.rsplit(':', 1)[0] if ':' in tag.rsplit('/', 1)[-1] else tag}@{digest}"


#: the unprivileged user that runs podman when tests or a local stack run as root (``make tools`` creates it
#: with a subuid/subgid range)
LOCAL_OCI_USER = "gpufleet-jobs"


def local_oci_user() -> str | None:
    """Who runs podman for local runs: :data:`LOCAL_OCI_USER` when this process is root, else None (itself)."""
    return LOCAL_OCI_USER if os.geteuid() == 0 else None


def local_oci_unavailable() -> str | None:
    """Why tenant containers cannot run here (for a test skip), or None."""
    reason = available()
    if reason:
        return reason
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam(LOCAL_OCI_USER)
        except KeyError:
            return f"user {LOCAL_OCI_USER} (with a subuid/subgid range) is missing: run `make tools`"
    return rootless_unavailable(local_oci_user())


@functools.cache
def rootless_unavailable(user: str | None) -> str | None:
    """Why rootless podman cannot run here as ``user`` (None: this process's own user), or None.

    ``podman info`` sets up the user's namespace and store, which every container needs: a kernel or
    sandbox that refuses unprivileged user namespaces, or a subuid range the host cannot map, fails here
    with podman's own words. Asked twice, a second apart, so that two processes initialising the same
    store at once do not read as a broken host."""
    from gpufleet.errors import ConfigError

    try:
        podman = Podman(user=user)
    except ConfigError as exc:
        return str(exc)
    for attempt in (1, 2):
        proc = podman.run("info", "--format", "{{.Store.GraphDriverName}}", check=False, timeout=120)
        if proc.returncode == 0:
            return None
        if attempt == 1:
            time.sleep(1)
    who = user or "this user"
    return f"rootless podman cannot run as {who} ({proc.returncode}): {stderr_reason(proc.stderr)}"


def jobs_dir(parent: str | None = None) -> Path:
    """A fresh directory for job directories that the podman user can reach (mode 0711)."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-jobs-", dir=parent))
    os.chmod(path, 0o711)
    return path


@dataclass
class LocalOci:
    """Tenant containers on this machine: the tools image and the runtime settings that reach it."""

    image: str
    image_id: str
    podman: Podman
    jobs_dir: Path
    #: RuntimeSettings keyword arguments
    settings: dict = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The same as ``GPUFLEET_*`` variables (for a runtime started as a process)."""
        return {f"GPUFLEET_{k.upper()}": str(v) for k, v in self.settings.items() if v is not None}


def prepare_local(parent: str | None = None) -> LocalOci:
    """Build (or reuse) the tools image in the local podman user's store and make a jobs directory it can
    reach. Call :func:`local_oci_unavailable` first."""
    user = local_oci_user()
    podman = Podman(user=user)
    image_id = ensure_image(podman)
    jobs = jobs_dir(parent)
    return LocalOci(TOOLS_IMAGE, image_id, podman, jobs,
                    {"oci_user": user, "jobs_dir": str(jobs), "gang_network": "local"})
