"""Who is calling the node API (pure): the node id is derived from the caller's IAM principal, server-side.

Contract: :func:`node_of` maps the ARN API Gateway puts in ``requestContext.identity.userArn`` to a node
id. Only an STS session of the agent role (``arn:<p>:sts::<acct>:assumed-role/<agent role>/<session>``)
is a node, and its session name is the node id. In AWS the agents' sessions come from IAM Roles
Anywhere, whose profile accepts a role session name only when the role's trust policy finds it equal
to the certificate's subject CN (infra/onprem.py), so a node's certificate decides its id; locally the
dev gateway maps each node's access key to such an ARN. Anything else — a tenant, another role, a
session name that is not a node id — is :class:`gpufleet.errors.NotAllowed` (403).

:func:`caller_of` also accepts a session of the cloud supervisor role whose name is a supervisor session
(:func:`gpufleet.nodeapi.supervisor.session_name`): the caller is then the supervisor principal
``sup:<epoch>:<job>`` (never a node id: those have no ``:``). Only the node API vends such sessions.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gpufleet.errors import NotAllowed
from gpufleet.nodeapi.liveness import NODE_ID_PATTERN
from gpufleet.nodeapi.supervisor import principal

_SESSION = re.compile(r"^arn:aws[a-z-]*:sts::\d{12}:assumed-role/(?P<role>[^/]+)/(?P<session>[^/]+)$")


def node_of(user_arn: str | None, agent_roles: Collection[str]) -> str:
    """The node id of a caller (see module); ``agent_roles`` are the agent role's names."""
    m = _SESSION.match(user_arn or "")
    if not m or m["role"] not in agent_roles or not NODE_ID_PATTERN.match(m["session"]):
        raise NotAllowed("the caller is not an on-prem node")
    return m["session"]


def agent_session_arn(account: str, role_name: str, node_id: str, partition: str = "aws") -> str:
    """The principal ARN of ``node_id``'s agent session (what API Gateway reports for it)."""
    return f"arn:{partition}:sts::{account}:assumed-role/{role_name}/{node_id}"


def caller_of(user_arn: str | None, agent_roles: Collection[str], supervisor_roles: Collection[str] = ()) -> str:
    """A node id (:func:`node_of`) or a cloud supervisor principal (see module); NotAllowed for anyone else."""
    m = _SESSION.match(user_arn or "")
    if m and m["role"] in supervisor_roles:
        found = principal(m["session"])
        if found is not None:
            return found
        raise NotAllowed("the caller is not a cloud supervisor session")
    return node_of(user_arn, agent_roles)
