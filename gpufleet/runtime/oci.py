"""Tenant containers under podman: the isolation flags, the podman invocation, host detection.

Contract:
- :func:`run_argv` (pure) is the one place the isolation of a tenant container is decided
  (docs/runtime.md, "Isolation"). The container runs ``spec.image`` with ``--pull never``
  (images come from the node's store, never a registry) as a per-job unprivileged uid
  (:func:`job_uid`, inside the podman user's subordinate id range), with a read-only root,
  no capabilities, ``no-new-privileges``, its own pid/ipc/uts/cgroup/network namespaces
  (``--network none`` unless the site's ``oci_network`` allows egress, or a gang member's ``gang_network``,
  :mod:`gpufleet.runtime.gangnet`, shares one), an init
  (catatonit) that forwards signals to the command, ulimits within the host's hard limits,
  and exactly these mounts: the job's inputs (read-only), output and checkpoint directories
  (read-write, chowned into the container's uid with ``:U``), and tmpfs ``/job/scratch`` and
  ``/tmp``. The environment is exactly what the caller passes (``--http-proxy=false``: no
  proxy variables leak from the host); GPUs are CDI devices ``nvidia.com/gpu=<index>``.
- :class:`Podman` runs podman. Rootless always: as ``oci_user`` when the runtime is root
  (podman then runs under that user's uid with a clean environment), else as the runtime's
  own (non-root) user. A root runtime without ``oci_user`` is a :class:`ConfigError`:
  tenant containers are never started by root's podman.
- Files the tenant wrote are read through ``podman unshare`` (as the podman user's
  namespace root, which owns them), never by following paths the tenant controls:
  :meth:`Podman.tar_dir` streams a deterministic tar of a directory (GNU tar; symlinks are
  stored as links, never followed), :meth:`Podman.reclaim` gives a directory back to the
  podman user once the container is gone.
- :meth:`Podman.start_reaper` starts a detached watchdog (its own session, re-parented to
  init, so a tree kill of the runtime does not reach it) that removes the container as soon
  as the runtime process ends, however it ends: a runtime killed with SIGKILL never
  leaves its tenant container running.
- :func:`detect_oci_runtime` / :func:`detect_cgroup_manager` resolve ``auto``: crun needs a
  unified (v2) cgroup hierarchy (crun refuses hybrid v1/v2 hosts), so runc is used on v1 and
  hybrid hosts; the cgroup manager is ``cgroupfs`` unless the host is unified and booted
  with systemd (then ``systemd``).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import resource
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import ConfigError

#: where the job directory appears inside the container
JOB_ROOT = "/job"
INPUT_DIR = f"{JOB_ROOT}/inputs"
OUTPUT_DIR = f"{JOB_ROOT}/output"
CHECKPOINT_DIR = f"{JOB_ROOT}/checkpoint"
SCRATCH_DIR = f"{JOB_ROOT}/scratch"
#: label carried by every tenant container (its job id)
JOB_LABEL = "org.gpufleet.job"
#: CDI kind of NVIDIA GPUs (nvidia-ctk cdi generate)
CDI_GPU_KIND = "nvidia.com/gpu"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: podman exit codes that are podman's own (not the command's): 125 podman failed, 126 not executable,
#: 127 not found
PODMAN_FAILED, NOT_EXECUTABLE, NOT_FOUND = 125, 126, 127
#: the variables of the runtime's own environment a podman run as the runtime's user keeps
_PASSED_ENV = ("HOME", "USER", "LOGNAME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "CONTAINERS_CONF",
               "CONTAINERS_STORAGE_CONF", "TMPDIR")
_CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Mount:
    host: Path
    container: str
    writable: bool


@dataclass(frozen=True)
class ContainerSpec:
    """Everything :func:`run_argv` needs to start one tenant container."""

    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    uid: int
    mounts: list[Mount]
    gpus: list[str] = field(default_factory=list)  # indices or UUIDs (CDI names both)
    network: str = "none"
    nofile: int = 1024
    nproc: int = 1024
    scratch_mb: int = 1024
    tmp_mb: int = 256
    workdir: str = SCRATCH_DIR
    labels: dict[str, str] = field(default_factory=dict)


#: the reaper (``sh -c``; $1 the container name, then the podman command): "done" on stdin (the runtime saw the
#: container end) exits at once; after end of file without it (the runtime died), kill
#: an in-flight ``podman run --name <name> --replace`` client (only run_argv's argv has that sequence), remove
#: the container, and repeat until no such client is left and the container does not exist
_REAPER = """read -r msg
[ "$msg" = done ] && exit 0
name=$1; shift
n=0
while :; do
  pkill -KILL -f -- "--name $name --replace" >/dev/null 2>&1 && sleep 0.5
  "$@" rm --force --ignore --time 0 "$name" >/dev/null 2>&1
  if ! pgrep -f -- "--name $name --replace" >/dev/null 2>&1 && \\
     ! "$@" container exists "$name" >/dev/null 2>&1; then exit 0; fi
  n=$((n + 1)); [ "$n" -ge 30 ] && exit 1
  sleep 1
done
"""


def container_name(job_id: str, epoch: int, rank: int | None = None) -> str:
    """The attempt's container name: unique per (job, epoch), so a retry never collides, and per gang member
    (``-r<rank>``), so two members placed on one host (two agents there) never replace each other's."""
    return f"gpufleet-{job_id}-e{epoch:04d}" + ("" if rank is None else f"-r{rank}")


def job_uid(job_id: str, base: int, span: int) -> int:
    """The container uid of a job: stable per job, spread over ``[base, base + span)`` so co-located
    jobs almost always run as different uids (their pid namespaces already keep them apart)."""
    return base + int(hashlib.sha256(job_id.encode()).hexdigest()[:12], 16) % span


def host_ulimit(which: int, want: int) -> int:
    """``want``, lowered to the host's hard limit (podman cannot raise a limit above it rootless)."""
    _soft, hard = resource.getrlimit(which)
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def run_argv(spec: ContainerSpec) -> list[str]:
    """``podman run`` arguments (after the global options) for ``spec``; see the module contract."""
    tmpfs = "rw,nosuid,nodev,mode=1777"
    argv = [
        "run", "--rm", "--pull", "never", "--name", spec.name, "--replace",
        "--init", "--log-driver", "none", "--sig-proxy=false",
        "--user", f"{spec.uid}:{spec.uid}",
        "--read-only", "--read-only-tmpfs=false",
        "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--pid", "private", "--ipc", "private", "--uts", "private", "--cgroupns", "private",
        "--network", spec.network, "--no-hosts", "--hostname", "job", "--http-proxy=false",
        "--ulimit", f"nofile={spec.nofile}:{spec.nofile}", "--ulimit", f"nproc={spec.nproc}:{spec.nproc}",
        "--ulimit", "core=0:0",
        "--tmpfs", f"{SCRATCH_DIR}:{tmpfs},size={spec.scratch_mb}m",
        "--tmpfs", f"/tmp:{tmpfs},size={spec.tmp_mb}m",
        "--workdir", spec.workdir,
    ]
    for m in spec.mounts:
        argv += ["--volume", f"{m.host}:{m.container}:{'rw,U' if m.writable else 'ro'}"]
    for key, value in sorted(spec.labels.items()):
        argv += ["--label", f"{key}={value}"]
    for i in spec.gpus:
        argv += ["--device", f"{CDI_GPU_KIND}={i}"]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, "--", spec.image, *spec.command]


def stderr_reason(stderr: bytes, limit: int = 600) -> str:
    """What podman said, for an error message: its warning lines dropped (a host whose ``/`` is not a
    shared mount repeats one on every call, and they bury the error), the last ``limit`` characters."""
    lines = [ln for ln in stderr.decode(errors="replace").splitlines()
             if ln.strip() and "level=warning" not in ln]
    text = " | ".join(ln.strip() for ln in lines) or "(podman printed only warnings)"
    return text if len(text) <= limit else "…" + text[-limit:]


def cgroup_unified() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


def detect_oci_runtime(preference: str = "auto") -> str:
    if preference != "auto":
        return preference
    if cgroup_unified() and shutil.which("crun"):
        return "crun"
    return "runc"


def detect_cgroup_manager(preference: str = "auto") -> str:
    if preference != "auto":
        return preference
    return "systemd" if cgroup_unified() and Path("/run/systemd/system").is_dir() else "cgroupfs"


def cdi_gpus_available() -> bool:
    """Whether a CDI spec for NVIDIA GPUs is installed (``nvidia-ctk cdi generate``)."""
    for d in CDI_DIRS:
        for p in sorted(Path(d).glob("*")) if Path(d).is_dir() else ():
            try:
                if p.suffix in (".yaml", ".yml", ".json") and CDI_GPU_KIND in p.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


class Podman:
    """Runs podman rootless, as ``user`` (when the runtime is root) or as the runtime's own user."""

    def __init__(self, binary: str = "podman", *, user: str | None = None, oci_runtime: str = "auto",
                 cgroup_manager: str = "auto") -> None:
        self.binary = binary
        self.user = user
        self.oci_runtime = detect_oci_runtime(oci_runtime)
        self.cgroup_manager = detect_cgroup_manager(cgroup_manager)
        if user is None and os.geteuid() == 0:
            raise ConfigError("the runtime runs as root: set GPUFLEET_OCI_USER to an unprivileged user with a "
                              "subuid/subgid range; tenant containers are never started by root's podman")
        if user is not None:
            try:
                self._pw = pwd.getpwnam(user)
            except KeyError:
                raise ConfigError(f"GPUFLEET_OCI_USER {user!r} does not exist (docs/agent.md, Isolation)")
            if self._pw.pw_uid == 0:
                raise ConfigError("GPUFLEET_OCI_USER must not be root")
            if os.geteuid() != 0 and os.geteuid() != self._pw.pw_uid:
                raise ConfigError(f"only root can run podman as {user!r}; unset GPUFLEET_OCI_USER to run it as "
                                  "this user")
        if not shutil.which(binary):
            raise ConfigError(f"{binary} is not installed (install podman, runc/crun, uidmap, catatonit)")

    # process plumbing ------------------------------------------------------------------------
    @property
    def owner_uid(self) -> int:
        """The host uid podman runs as (the containers' user-namespace root)."""
        return self._pw.pw_uid if self.user is not None else os.geteuid()

    @property
    def owner_gid(self) -> int:
        return self._pw.pw_gid if self.user is not None else os.getegid()

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--runtime", self.oci_runtime, "--cgroup-manager", self.cgroup_manager, *args]

    def popen_kwargs(self) -> dict:
        """``subprocess`` arguments: the podman user's identity and a clean environment (nothing of the
        runtime's own environment — credentials included — reaches podman or the container)."""
        if self.user is None:
            # named keys read one by one: iterating os.environ races a thread that removes a variable
            # (a key listed, then gone, is a KeyError)
            env = {k: v for k in _PASSED_ENV if (v := os.environ.get(k)) is not None}
            env.update(PATH=_CLEAN_PATH, LANG="C.UTF-8")
            return {"env": env}
        env = {"HOME": self._pw.pw_dir, "USER": self.user, "LOGNAME": self.user, "PATH": _CLEAN_PATH,
               "LANG": "C.UTF-8"}
        return {"env": env, "user": self._pw.pw_uid, "group": self._pw.pw_gid, "extra_groups": [],
                "cwd": "/"}

    def run(self, *args: str, timeout: float = 60, input: bytes | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(*args), input=input, capture_output=True, timeout=timeout,
                              **self.popen_kwargs())
        if check and proc.returncode != 0:
            raise ConfigError(f"podman {args[0]} failed ({proc.returncode}): {stderr_reason(proc.stderr)}")
        return proc

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), **{**self.popen_kwargs(), **kw})

    # containers ----------------------------------------------------------------------------
    def image_id(self, image: str) -> str | None:
        """The image's id (sha256 of its config) in the node's store, or None when it is not there."""
        proc = self.run("image", "inspect", "--format", "{{.Id}}", image, check=False)
        if proc.returncode != 0:
            return None
        return proc.stdout.decode().strip() or None

    def running_pid(self, name: str) -> int | None:
        """The host pid of the running container's init (``State.Pid``), or None when it is not running."""
        proc = self.run("container", "inspect", "--format", "{{.State.Status}} {{.State.Pid}}", name, check=False)
        got = proc.stdout.decode().split()
        if proc.returncode != 0 or len(got) != 2 or got[0] != "running" or not got[1].isdigit() or got[1] == "0":
            return None
        return int(got[1])

    def netns_id(self, pid: int) -> str | None:
        """The identity (``net:[inode]``) of process ``pid``'s network namespace, read inside podman's user
        namespace (so a rootless podman's container processes are readable); None when it cannot be read."""
        proc = self.run("unshare", "readlink", f"/proc/{int(pid)}/ns/net", check=False)
        got = proc.stdout.decode().strip() if proc.returncode == 0 else ""
        return got if got.startswith("net:[") else None

    def stop(self, name: str, grace_s: float) -> None:
        """SIGTERM to the container's init (forwarded to the command), SIGKILL after ``grace_s``."""
        self.run("stop", "--ignore", "--time", str(max(0, int(round(grace_s)))), name,
                 timeout=grace_s + 30, check=False)

    def kill(self, name: str) -> None:
        self.run("kill", "--signal", "KILL", name, check=False)

    def remove(self, name: str) -> None:
        self.run("rm", "--force", "--ignore", "--time", "0", name, check=False)

    def start_reaper(self, name: str) -> int:
        """Start the watchdog that removes ``name`` when this process ends; returns the fd to keep open.

        The watchdog reads a pipe whose only write end this process holds: end of file means
        the runtime is gone (exit, crash or SIGKILL); :meth:`dismiss_reaper` sends it away instead once
        the container has ended normally. It is started with ``setsid --fork``, so it
        is re-parented to init at once and no tree kill of the runtime reaches it. Then it kills a
        ``podman run`` of ``name`` still in flight (the runtime may die while podman is creating the
        container: a remove before the container exists would miss it, and the container would
        start afterwards, orphaned) and removes the container, until neither is left (at most 30
        rounds a second apart)."""
        read_fd, write_fd = os.pipe()
        try:
            subprocess.run(["setsid", "--fork", "sh", "-c", _REAPER, "gpufleet-reaper", name, *self.argv()],
                           stdin=read_fd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=10,
                           **self.popen_kwargs())
        finally:
            os.close(read_fd)
        return write_fd

    @staticmethod
    def dismiss_reaper(fd: int) -> None:
        """Tell the reaper started with :meth:`start_reaper` that the container is gone (it exits doing
        nothing), then close ``fd``. Only end of file without this word (the runtime died) sets it to work."""
        try:
            os.write(fd, b"done\n")
        finally:
            os.close(fd)

    # files the tenant wrote ----------------------------------------------------------------
    def hand_over(self, folder: Path) -> None:
        """Give ``folder`` (created by this process) to the podman user, so that podman can mount it
        and chown it into the container (``:U``). A no-op when podman runs as this process's user."""
        if self.user is None:
            return
        for root, dirs, files in os.walk(folder):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), self.owner_uid, self.owner_gid)
        os.lchown(folder, self.owner_uid, self.owner_gid)

    def tar_dir(self, folder: Path, timeout: float = 600) -> bytes:
        """A deterministic tar of ``folder`` (sorted names, zero times, numeric owner 0), read as the
        namespace root that owns the tenant's files; symlinks are stored, never followed."""
        proc = self.run("unshare", "tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0",
                        "--numeric-owner", "--format=gnu", "-C", str(folder), "-cf", "-", ".", timeout=timeout)
        return proc.stdout

    def reclaim(self, folder: Path) -> None:
        """Make everything under ``folder`` the podman user's again (owner-readable), after the container."""
        self.run("unshare", "sh", "-c", 'chown -R 0:0 "$1" && chmod -R u+rwX "$1"', "gpufleet-reclaim",
                 str(folder), timeout=600)


def check_traversable(folder: Path, uid: int, gid: int) -> None:
    """ConfigError unless ``uid``/``gid`` can reach ``folder`` (every ancestor searchable by it)."""
    for p in [folder, *folder.parents]:
        st = p.stat()
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            raise ConfigError(f"{p} is not searchable by the OCI user (uid {uid}); put GPUFLEET_JOBS_DIR "
                              "somewhere it can reach")
