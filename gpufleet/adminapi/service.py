"""The administration operations: onboarding tenants, teams and users, the quota tree, safety profiles, pools,
node binding, draining and deregistration, the model catalog. Every change is one :class:`gpufleet.store.admin.Change` written with its audit
record; the caller has already been checked to be an admin principal (:mod:`gpufleet.adminapi.app`).

Contract:
- Every write is conditional: creating something that exists is a 409, changing something absent a 404,
  and an ``expected_version`` that is not the stored one a 409 ``conflict`` with ``current_version``;
  without one, the version read just before is expected (a concurrent change still loses, never silently).
- Parents must exist: a team needs its tenant, a user its team, a quota node its tenant (and team), a
  safety profile its tenant, a node binding the pool (deployed or defined here).
- Nothing here is cached by its readers: the API reads principals per request, the scheduler reads quota
  nodes, tenant defaults, pools and node items on every pass, CheckPrompt reads the safety profile per job,
  so a change takes effect on the next request or pass without a redeploy.
- Bad input is a :class:`~gpufleet.errors.ValidationFailed` (400) naming the field.
- The model catalog (:mod:`gpufleet.models.catalog`): a registration reads the published manifest
  (``<models root><name>/manifest.json``) itself and records its hash (:func:`gpufleet.models.catalog.registration`);
  registering the hash an entry already has changes nothing (no write, no audit record); another hash replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpufleet.adminapi.models import (
    NAME_PATTERN,
    ModelIn,
    NodeBindIn,
    PoolIn,
    QuotaIn,
    SafetyIn,
    SafetyReportIn,
    TeamIn,
    TenantIn,
    TenantPatch,
    UserIn,
)
from gpufleet.clock import Clock, iso
from gpufleet.errors import Conflict, NotFound, ValidationFailed
from gpufleet.ids import is_job_id, ulid
from gpufleet.models import catalog
from gpufleet.pools import Pool
from gpufleet.safety.profile import SafetyProfile
from gpufleet.store.admin import AdminStore, AuditRecord, Change, Ref
from gpufleet.store.principals import Principal

_NAME = re.compile(NAME_PATTERN)
#: how long a deregistered node's tombstone is kept (the control table's TTL removes it after): a day, far longer
#: than any heartbeat that read the registration just before it was deleted can take to land
TOMBSTONE_TTL_S = 86_400


@dataclass
class AdminDeps:
    store: AdminStore
    clock: Clock
    #: the deployment's pools (GPUFLEET_POOLS); operators' pool documents add to or override them
    pools: tuple[Pool, ...] = ()
    #: the published models' manifests (GPUFLEET_MODEL_S3_ROOT); none: every registration names its hash
    manifests: catalog.Manifests = field(default_factory=catalog.NoManifests)
    new_id: Callable[[], str] = field(default=lambda: ulid().lower())


class AdminService:
    def __init__(self, deps: AdminDeps) -> None:
        self.d = deps

    # ------------------------------------------------------------------ plumbing

    def _write(self, who: Principal, action: str, change: Change, detail: dict[str, Any]) -> None:
        record = AuditRecord(at=iso(self.d.clock.now()), id=self.d.new_id(), actor=who.arn, action=action,
                             target=change.ref.describe(), detail=detail)
        self.d.store.write(change, record)

    def _get(self, ref: Ref) -> dict[str, Any]:
        found = self.d.store.get(ref)
        if found is None:
            raise NotFound(f"{ref.describe()} does not exist")
        return found

    def _expected(self, ref: Ref, given: int | None) -> int:
        if given is not None:
            return given
        current = self.d.store.get(ref)
        return int(current.get("version", 0)) if current else 0

    @staticmethod
    def _name(value: str, field_name: str) -> str:
        if not _NAME.match(value or ""):
            raise ValidationFailed(f"{field_name} must be 1-63 of A-Za-z0-9._- starting with a letter or digit",
                                   field=field_name)
        return value

    # ------------------------------------------------------------------ tenants, teams, users

    def create_tenant(self, who: Principal, body: TenantIn) -> dict[str, Any]:
        ref = Ref("tenant", body.tenant)
        attrs = {"tenant": body.tenant, "display_name": body.display_name, "created_at": iso(self.d.clock.now()),
                 "created_by": who.arn}
        if body.placement_policy:
            attrs["placement_policy"] = body.placement_policy.value
        self._write(who, "tenant.create", Change(ref, attrs, expected_version=0), attrs)
        return self.tenant(body.tenant)

    def tenant(self, tenant: str) -> dict[str, Any]:
        doc = self._get(Ref("tenant", self._name(tenant, "tenant")))
        return {k: v for k, v in doc.items() if k in ("tenant", "display_name", "placement_policy", "created_at",
                                                         "created_by", "version", "updated_at", "updated_by")}

    def tenants(self) -> list[dict[str, Any]]:
        return sorted((t for t in self.d.store.list("tenant") if t.get("version")), key=lambda t: t["tenant"])

    def update_tenant(self, who: Principal, tenant: str, body: TenantPatch) -> dict[str, Any]:
        ref = Ref("tenant", self._name(tenant, "tenant"))
        attrs: dict[str, Any] = {"updated_at": iso(self.d.clock.now()), "updated_by": who.arn}
        if body.display_name is not None:
            attrs["display_name"] = body.display_name
        if body.placement_policy is not None:
            attrs["placement_policy"] = body.placement_policy.value
        expected = self._expected(ref, body.expected_version) or None
        self._write(who, "tenant.update", Change(ref, attrs, expected_version=expected), attrs)
        return self.tenant(tenant)

    def create_team(self, who: Principal, tenant: str, body: TeamIn) -> dict[str, Any]:
        tenant = self._name(tenant, "tenant")
        ref = Ref("team", body.team, tenant)
        attrs = {"tenant": tenant, "team": body.team, "created_at": iso(self.d.clock.now()), "created_by": who.arn}
        self._write(who, "team.create", Change(ref, attrs, expected_version=0, requires=(Ref("tenant", tenant),)),
                    attrs)
        return self._get(ref)

    def teams(self, tenant: str) -> list[dict[str, Any]]:
        self._get(Ref("tenant", self._name(tenant, "tenant")))
        return sorted(self.d.store.list("team", tenant), key=lambda t: t["team"])

    def add_user(self, who: Principal, tenant: str, body: UserIn) -> dict[str, Any]:
        tenant = self._name(tenant, "tenant")
        ref = Ref("principal", body.arn)
        attrs: dict[str, Any] = {"arn": body.arn, "tenant": tenant, "team": body.team, "user": body.user,
                                 "created_at": iso(self.d.clock.now()), "created_by": who.arn}
        if body.admin:
            attrs["admin"] = True
        self._write(who, "user.add", Change(ref, attrs, expected_version=0,
                                            requires=(Ref("team", body.team, tenant),)), attrs)
        return self._get(ref)

    def users(self, tenant: str) -> list[dict[str, Any]]:
        tenant = self._name(tenant, "tenant")
        return sorted((p for p in self.d.store.list("principal") if p.get("tenant") == tenant),
                      key=lambda p: (p.get("team", ""), p.get("user", ""), p.get("arn", "")))

    def remove_user(self, who: Principal, tenant: str, arn: str) -> dict[str, Any]:
        ref = Ref("principal", arn)
        current = self._get(ref)
        if current.get("tenant") != tenant:
            raise NotFound(f"{ref.describe()} does not exist in tenant {tenant}")
        if arn == who.arn:
            raise ValidationFailed("an operator cannot remove their own principal", field="arn")
        self._write(who, "user.remove", Change(ref, delete=True, expected_version=current.get("version")),
                    {"tenant": tenant, "team": current.get("team"), "user": current.get("user")})
        return current

    # ------------------------------------------------------------------ quota tree

    def _quota_ref(self, path: str) -> tuple[Ref, tuple[Ref, ...]]:
        parts = path.split("/")
        if not 1 <= len(parts) <= 3:
            raise ValidationFailed("a quota path is tenant, tenant/team or tenant/team/user", field="path")
        for name, part in zip(("tenant", "team", "user"), parts, strict=False):
            self._name(part, name)
        requires: tuple[Ref, ...] = (Ref("tenant", parts[0]),)
        if len(parts) > 1:
            requires += (Ref("team", parts[1], parts[0]),)
        return Ref("quota", path), requires

    def quotas(self) -> list[dict[str, Any]]:
        """Every quota node (tenant, team and user levels), by path."""
        return sorted(self.d.store.list("quota"), key=lambda q: str(q.get("path", "")))

    def quota(self, path: str) -> dict[str, Any]:
        ref, _ = self._quota_ref(path)
        return self._get(ref)

    def set_quota(self, who: Principal, path: str, body: QuotaIn) -> dict[str, Any]:
        from gpufleet.scheduler.model import QuotaNode

        ref, requires = self._quota_ref(path)
        node = QuotaNode(path, dict(body.guarantee), dict(body.borrow_limit), dict(body.weight))
        limits = {t: node.limit(t) for t in set(node.guarantee) | set(node.borrow_limit)}
        attrs = {"path": path, "guarantee": dict(body.guarantee), "borrow_limit": dict(body.borrow_limit),
                 "weight": {k: float(v) for k, v in body.weight.items()}, "limits": limits,
                 "updated_at": iso(self.d.clock.now()), "updated_by": who.arn}
        expected = self._expected(ref, body.expected_version)
        if expected == 0 and self.d.store.get(ref) is not None:
            expected = None  # a node written before versions (seeded): it must still exist
        self._write(who, "quota.set", Change(ref, attrs, expected_version=expected, requires=requires),
                    {k: attrs[k] for k in ("guarantee", "borrow_limit", "weight")})
        return self._get(ref)

    # ------------------------------------------------------------------ safety profiles

    def safety(self, tenant: str) -> dict[str, Any] | None:
        return self.d.store.get(Ref("safety", self._name(tenant, "tenant")))

    def set_safety(self, who: Principal, tenant: str, body: SafetyIn) -> dict[str, Any]:
        tenant = self._name(tenant, "tenant")
        ref = Ref("safety", tenant)
        expected = self._expected(ref, body.expected_version)
        try:
            profile = SafetyProfile(tenant=tenant, frame_thresholds=body.frame_thresholds, backend=body.backend,
                                    max_frames=body.max_frames, version=expected + 1,
                                    updated_at=iso(self.d.clock.now()), updated_by=who.arn)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "profile"
            raise ValidationFailed(f"invalid safety profile: {where}: {first['msg']}", field=where)
        attrs = {"type": "safety_profile", **profile.model_dump(mode="json", exclude={"version"})}
        self._write(who, "safety.set", Change(ref, attrs, expected_version=expected,
                                              requires=(Ref("tenant", tenant),)), attrs)
        return self._get(ref)

    # ------------------------------------------------------------------ safety reports

    #: what a report keeps of the job's prompt_checked decision
    DECISION_KEYS = ("allowed", "category", "score", "nearest_category", "nearest_score", "policy_version", "reason")

    def safety_report(self, job_id: str) -> dict[str, Any]:
        return self._get(Ref("safety_report", self._job_id(job_id)))

    def safety_reports(self) -> list[dict[str, Any]]:
        """Every report, oldest first (the evaluation set ``gpufleet safety eval`` reads)."""
        return sorted(self.d.store.list("safety_report"), key=lambda d: (d.get("reported_at", ""), d.get("job_id")))

    def report_safety(self, who: Principal, job_id: str, body: SafetyReportIn) -> dict[str, Any]:
        """Store (or, with the stored version, relabel) the operator's report on a job's prompt decision."""
        job_id = self._job_id(job_id)
        if body.label == "unsafe" and not body.category:
            raise ValidationFailed("an unsafe report names the category the prompt belongs to", field="category")
        ref = Ref("safety_report", job_id)
        expected = self._expected(ref, body.expected_version)
        given = body.decision or {}
        decision = {k: given[k] for k in self.DECISION_KEYS if given.get(k) is not None}
        if decision and not isinstance(decision.get("allowed"), bool):
            raise ValidationFailed("decision.allowed must be true or false", field="decision.allowed")
        recorded = decision.get("allowed")
        kind = None if recorded is None else (
            "false_negative" if body.label == "unsafe" and recorded else
            "false_positive" if body.label == "safe" and not recorded else "confirmed")
        attrs = {"type": "safety_report", "job_id": job_id, "label": body.label, "category": body.category,
                 "prompt": body.prompt, "decision": decision or None, "kind": kind, "note": body.note,
                 "reported_at": iso(self.d.clock.now()), "reported_by": who.arn}
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self._write(who, "safety.report", Change(ref, attrs, expected_version=expected),
                    {k: v for k, v in attrs.items() if k != "prompt"})
        return self._get(ref)

    @staticmethod
    def _job_id(job_id: str) -> str:
        if not is_job_id(job_id):
            raise ValidationFailed(f"{job_id!r} is not a job id", field="job_id")
        return job_id

    # ------------------------------------------------------------------ pools

    def pools(self) -> list[dict[str, Any]]:
        """The deployment's pools overlaid by operators' pool documents (what the scheduler places on)."""
        from gpufleet.pools import merge_pools

        docs = self.d.store.list("pool")
        merged = {p.name: p.model_dump(mode="json") for p in merge_pools(self.d.pools, docs)}
        for doc in docs:
            if doc.get("name") in merged:
                merged[doc["name"]].update({k: doc[k] for k in ("version", "updated_at", "updated_by") if k in doc})
        return [merged[k] for k in sorted(merged)]

    def put_pool(self, who: Principal, name: str, body: PoolIn) -> dict[str, Any]:
        from gpufleet.pools import merge_pools

        if not re.match(r"^[a-z0-9][a-z0-9-]{0,63}$", name):
            raise ValidationFailed("a pool name is 1-64 of a-z, 0-9 and '-'", field="name")
        ref = Ref("pool", name)
        attrs = {"name": name, **body.model_dump(mode="json", exclude={"expected_version"}),
                 "updated_at": iso(self.d.clock.now()), "updated_by": who.arn}
        deployed = {p.name: p for p in self.d.pools}
        if body.kind.value != "onprem" and name not in deployed:
            raise ValidationFailed("only on-prem pools can be added here; a cloud pool needs its Batch queue and "
                                   "job definition in the deployment", field="kind")
        try:
            merge_pools(self.d.pools, [attrs])
        except ValueError as err:
            raise ValidationFailed(f"invalid pool: {err}", field="body")
        self._write(who, "pool.put", Change(ref, attrs, expected_version=self._expected(ref, body.expected_version)),
                    attrs)
        return next(p for p in self.pools() if p["name"] == name)

    def delete_pool(self, who: Principal, name: str) -> dict[str, Any]:
        ref = Ref("pool", name)
        current = self._get(ref)
        self._write(who, "pool.delete", Change(ref, delete=True, expected_version=current.get("version")), {})
        return current

    # ------------------------------------------------------------------ nodes

    def nodes(self) -> list[dict[str, Any]]:
        return sorted(self.d.store.list("registration"), key=lambda n: n["node_id"])

    def node(self, node_id: str) -> dict[str, Any]:
        return self._get(Ref("registration", node_id))

    def bind_node(self, who: Principal, node_id: str, body: NodeBindIn) -> dict[str, Any]:
        ref = Ref("registration", node_id)
        current = self._get(ref)
        if body.pool not in {p["name"] for p in self.pools()}:
            raise ValidationFailed(f"no pool {body.pool}: define it first (pool put)", field="pool")
        attrs = {"pool": body.pool, "updated_at": iso(self.d.clock.now()), "updated_by": who.arn}
        expected = body.expected_version if body.expected_version is not None else current.get("version")
        self._write(who, "node.bind", Change(ref, attrs, expected_version=expected),
                    {"pool": body.pool, "previous_pool": current.get("pool")})
        return self._get(ref)

    def drain(self, who: Principal, node_id: str, drained: bool) -> dict[str, Any]:
        """Drain (no new placements; running jobs finish) or undrain a node: the registration records it (every
        heartbeat reports it) and the node's liveness item is marked now (the next scheduler pass sees it)."""
        ref = Ref("registration", node_id)
        current = self._get(ref)
        attrs = {"drained": drained, "updated_at": iso(self.d.clock.now()), "updated_by": who.arn}
        self._write(who, "node.drain" if drained else "node.undrain",
                    Change(ref, attrs, expected_version=current.get("version")), {"drained": drained})
        self.d.store.mark_draining(node_id, drained)
        return self._get(ref)

    def deregister(self, who: Principal, node_id: str, *, force: bool = False,
                   expected_version: int | None = None) -> dict[str, Any]:
        """Remove a node from the fleet: its registration is deleted and its liveness item becomes a tombstone, in
        one transaction with the audit record (:meth:`gpufleet.store.admin.AdminStore.deregister`). The scheduler's
        next pass no longer sees it; the node API refuses its heartbeats and ``self`` at once and its attempt calls
        within :data:`~gpufleet.nodeapi.registered.REGISTRATION_TTL_S`. A node still holding attempts (booked
        allocations) is refused (409, naming them: drain it and let them end first) unless ``force``: its
        attempts can no longer heartbeat, so each ends at its Run state's heartbeat timeout and the lifecycle
        places it again elsewhere (a new epoch; the old one is fenced). Its queues are kept (a registration of the
        same id uses them again)."""
        ref = Ref("registration", node_id)
        current = self._get(ref)
        active = self.d.store.node_allocations(node_id)
        if active and not force:
            shown = ", ".join(active[:10]) + (f" and {len(active) - 10} more" if len(active) > 10 else "")
            raise Conflict(f"node {node_id} holds {len(active)} attempt(s) ({shown}): drain it and let them end, "
                           "or deregister with force=true (they end at their heartbeat timeout and are placed again)",
                           current_version=int(current.get("version", 0)))
        now = self.d.clock.now()
        version = expected_version if expected_version is not None else int(current.get("version", 0))
        record = AuditRecord(at=iso(now), id=self.d.new_id(), actor=who.arn, action="node.deregister",
                             target=ref.describe(), detail={"pool": current.get("pool"), "force": force,
                                                            "attempts": active[:50]})
        self.d.store.deregister(node_id, record, expected_version=version, purge_at=int(now) + TOMBSTONE_TTL_S)
        return {"node_id": node_id, "deregistered_at": record.at, "pool": current.get("pool"), "attempts": active,
                "forced": bool(active)}

    # ------------------------------------------------------------------ the model catalog

    def models(self) -> list[dict[str, Any]]:
        return sorted(self.d.store.list("model"), key=lambda m: m["name"])

    def model(self, name: str) -> dict[str, Any]:
        return self._get(Ref("model", catalog.checked_name(name, registering=False)))

    def put_model(self, who: Principal, name: str, body: ModelIn) -> dict[str, Any]:
        """Register ``name`` (or replace its hash): the published manifest's hash, else the body's (see module)."""
        name = catalog.checked_name(name)
        raw = self.d.manifests.read(name)
        published = catalog.parse_manifest(name, raw) if raw is not None else None
        decided = catalog.registration(name, body.content_hash, published,
                                       self.d.manifests.root or "this deployment's models root (none is configured)")
        ref = Ref("model", name)
        current = self.d.store.get(ref)
        version = int(current.get("version", 0)) if current else 0
        if body.expected_version is not None and body.expected_version != version:
            raise Conflict(f"model {name} is at version {version}, not {body.expected_version}",
                           current_version=version)
        if current and all(current.get(k) == v for k, v in decided.items() if k != "bytes"):
            return current  # registered with this very content already: nothing to change
        now = iso(self.d.clock.now())
        attrs: dict[str, Any] = {"name": name, **decided, "updated_at": now, "updated_by": who.arn}
        if current is None:
            attrs.update(created_at=now, created_by=who.arn)
        detail = {"content_hash": decided["content_hash"], "source": decided["source"],
                  "previous_hash": (current or {}).get("content_hash")}
        self._write(who, "model.register", Change(ref, attrs, expected_version=version), detail)
        return self._get(ref)

    def delete_model(self, who: Principal, name: str, expected_version: int | None = None) -> dict[str, Any]:
        """Deregister ``name``: jobs naming it are refused from then on (jobs admitted before keep their pinned hash)."""
        ref = Ref("model", catalog.checked_name(name, registering=False))
        current = self._get(ref)
        version = expected_version if expected_version is not None else int(current.get("version", 0))
        self._write(who, "model.deregister", Change(ref, delete=True, expected_version=version),
                    {"content_hash": current.get("content_hash")})
        return current

    # ------------------------------------------------------------------ audit

    def audit(self, month: str | None, limit: int) -> list[dict[str, Any]]:
        month = month or iso(self.d.clock.now())[:7]
        if not re.match(r"^\d{4}-\d{2}$", month):
            raise ValidationFailed("month is yyyy-mm", field="month")
        return self.d.store.audit_log(month, limit)
