"""The ``agent.toml`` a registration gives its node (``gpufleet admin node register … --agent-config PATH``).

Contract: :func:`render` turns the registration's ``agent`` block (``POST /v1/nodes``: node id, pool, queue and
signal queue URLs, region, table names, bound labels; ``lambdas.nodes.register.agent_settings``) and the node API's
URL (the deployment's API endpoint, the operator's own) into an ``[agent]`` TOML document that
``onprem_agent.settings.load_settings`` accepts; every other key keeps the agent's default
(``onprem_agent/packaging/agent.toml`` documents them). :func:`write` creates the file (mode 0640) and never
replaces one (:class:`~gpufleet.errors.BadRequest`): a configured node is edited by hand, not regenerated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpufleet.errors import BadRequest

#: the keys taken from the registration, in the order written
KEYS = ("node_id", "pool", "queue_url", "signals_queue_url", "node_api_url", "region", "jobs_table", "control_table")


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {json.dumps(str(v))}" for k, v in sorted(value.items())) + " }"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def render(agent: dict[str, Any], node_api_url: str) -> str:
    values = {**agent, "node_api_url": node_api_url}
    lines = ["# gpufleet agent settings for this node, from its registration (gpufleet admin node register).",
             "# Every other key keeps the agent's default; onprem_agent/packaging/agent.toml documents them all.",
             "[agent]"]
    lines += [f"{k} = {_toml(values[k])}" for k in KEYS if values.get(k)]
    lines.append(f"labels = {_toml(values.get('labels') or {})}")
    return "\n".join(lines) + "\n"


def write(path: str | os.PathLike[str], text: str) -> Path:
    out = Path(path)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        raise BadRequest(f"{out} exists: not replaced (edit it, or write the new one elsewhere)") from None
    except OSError as err:
        raise BadRequest(f"cannot write {out}: {err.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return out
