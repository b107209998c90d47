"""IAM principals → tenant / team / user (control table, ``PRINCIPAL#<arn>`` / ``PRINCIPAL``).

Contract:
- :func:`put_principal` registers an IAM ARN (user, role, or assumed-role
  session) as a caller of one tenant/team/user; ``admin=True`` marks an operator (only operators
  may register nodes, ``POST /v1/nodes``).
- :func:`resolve` maps the ARN API Gateway puts in
  ``requestContext.identity.userArn`` to a :class:`Principal`. An STS
  assumed-role session (``arn:aws:sts::<acct>:assumed-role/<role>/<session>``)
  is matched exactly first, then by its role (``arn:aws:iam::<acct>:role/<role>``).
  An unknown ARN raises :class:`gpufleet.errors.Unauthorized` (403).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.errors import Unauthorized
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.tables import PRINCIPAL_SK, principal_pk

SK = PRINCIPAL_SK
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_ASSUMED = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")


class Principal(BaseModel):
    """Who is calling: the quota path is ``tenant/team/user``."""

    model_config = ConfigDict(frozen=True)

    arn: str
    tenant: str = Field(pattern=_NAME)
    team: str = Field(pattern=_NAME)
    user: str = Field(pattern=_NAME)
    admin: bool = False

    @property
    def owner_path(self) -> str:
        return f"{self.tenant}/{self.team}/{self.user}"


def role_arn_of(arn: str) -> str | None:
    """The IAM role ARN behind an STS assumed-role session ARN, else ``None``."""
    m = _ASSUMED.match(arn)
    if not m:
        return None
    partition, account, role = m.groups()
    return f"arn:{partition}:iam::{account}:role/{role}"


def put_principal(client, table: str, arn: str, tenant: str, team: str, user: str, *, admin: bool = False) -> Principal:
    """Register (or overwrite) the mapping of ``arn``."""
    p = Principal(arn=arn, tenant=tenant, team=team, user=user, admin=admin)
    item = {"pk": principal_pk(arn), "sk": SK, "arn": arn, "tenant": tenant, "team": team, "user": user}
    if admin:
        item["admin"] = True
    client.put_item(TableName=table, Item=marshal(item))
    return p


def _get(client, table: str, arn: str) -> Principal | None:
    item = unmarshal(client.get_item(TableName=table, Key=marshal({"pk": principal_pk(arn), "sk": SK})).get("Item"))
    if not item:
        return None
    return Principal(arn=arn, tenant=item["tenant"], team=item["team"], user=item["user"],
                     admin=bool(item.get("admin", False)))


def resolve(client, table: str, arn: str | None) -> Principal:
    """Map a caller ARN to its principal; raise :class:`Unauthorized` when unknown or absent."""
    if not arn:
        raise Unauthorized("the request carries no IAM principal")
    found = _get(client, table, arn)
    if found is None:
        role = role_arn_of(arn)
        if role:
            found = _get(client, table, role)
    if found is None:
        raise Unauthorized("this IAM principal is not registered with gpufleet")
    return found
