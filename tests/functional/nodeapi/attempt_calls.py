"""The node API's attempt routes as the route sweeps try them: a body each op would accept from the attempt's owner
(``{job}`` stands for the job's id) and the op an attempt route names."""

from __future__ import annotations

import json

from gpufleet.nodeapi.app import ATTEMPT_PATH

SHA = "b" * 64
#: a body every attempt route (by op) would accept from the attempt's owner; ``{job}`` is the job's id
BODIES = {
    "view": {}, "heartbeat": {}, "beat": {}, "progress": {"step": 3, "total": 10}, "running": {},
    "checkpoint": {"key": "jobs/{job}/checkpoints/x.ckpt", "sha256": SHA, "step": 3},
    "generated": {"key": "jobs/{job}/out.bin", "sha256": SHA, "files": 1}, "staging": {"staging": {"bytes_moved": 1}},
    "phases": {"phases": {"started": 1.0}}, "event": {"kind": "resumed", "detail": {"step": 3}}, "credentials": {},
    "complete": {"gpu_seconds": 5.0}, "fail": {"error": "USER_ERROR", "detail": "forged"},
}


def body(op: str, job_id: str) -> dict:
    return json.loads(json.dumps(BODIES[op]).replace("{job}", job_id))


def op_of(route: tuple[str, str]) -> str | None:
    """The op of an attempt route ``(method, path template)``; None for any other route."""
    prefix = ATTEMPT_PATH.split("{op}")[0]
    method, path = route
    return path[len(prefix):] if method == "POST" and path.startswith(prefix) else None
