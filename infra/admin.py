"""Who may administer gpufleet: the operators' IAM policy and role, and the tenants' users' policy.

Contract:
- :attr:`AdminAccess.admin_policy` (managed policy ``<prefix>-admin-invoke``) allows ``execute-api:Invoke``
  on ``/v1/admin/*`` and ``POST /v1/nodes`` of this REST API, nothing else; :attr:`AdminAccess.admin_role`
  (``<prefix>-admin``) carries it and may be assumed by principals of this account that the account's own
  policies allow to (``sts:AssumeRole``), with MFA. Attach the policy to an operator's user or role, or let
  them assume the role.
- :attr:`AdminAccess.tenant_policy` (``<prefix>-tenant-invoke``) allows the jobs API only (``/v1/jobs*``,
  ``/v1/quota``, ``/v1/pools``, ``/v1/openapi.json``): attach it to tenants' users and roles.
- IAM is the first gate only: the administration API checks server-side that the caller's principal is
  registered with ``admin: true`` (:mod:`gpufleet.adminapi.app`), so the policy alone grants nothing, and
  a tenant's user whose policy were too broad is still refused (403).
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import InfraConfig


class AdminAccess(Construct):
    def __init__(self, scope: Construct, cid: str, *, config: InfraConfig, admin_api_arns: list[str],
                 tenant_api_arns: list[str]) -> None:
        super().__init__(scope, cid)
        self.admin_policy = iam.ManagedPolicy(
            self, "AdminInvokePolicy", managed_policy_name=config.name("admin-invoke"),
            description="gpufleet operators: the administration API and node registration",
            statements=[iam.PolicyStatement(sid="AdminApi", actions=["execute-api:Invoke"], resources=admin_api_arns)],
        )
        self.admin_role = iam.Role(
            self, "AdminRole", role_name=config.name("admin"),
            description="gpufleet operators (register the role's ARN as an admin principal)",
            assumed_by=iam.AccountRootPrincipal().with_conditions({"Bool": {"aws:MultiFactorAuthPresent": "true"}}),
            managed_policies=[self.admin_policy],
        )
        self.tenant_policy = iam.ManagedPolicy(
            self, "TenantInvokePolicy", managed_policy_name=config.name("tenant-invoke"),
            description="gpufleet tenants' users: the jobs API only",
            statements=[iam.PolicyStatement(sid="JobsApi", actions=["execute-api:Invoke"], resources=tenant_api_arns)],
        )
