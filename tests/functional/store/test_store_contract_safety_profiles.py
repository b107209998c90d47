"""Contract of :class:`gpufleet.store.safety_profiles.SafetyProfileStore` (CheckPrompt's reads), on the fake and
on moto.

Profiles are written by the administration store (``Ref("safety", tenant)``, as ``PUT
/v1/admin/tenants/{tenant}/safety-profile`` does: the store numbers the versions); the safety store reads the
tenant's profile back (``None``: the deployment default), resolves what a job gets now, and fails closed on a
stored item that no longer validates. A profile left at the old key (``TENANT#<t>`` / ``SAFETY``) is not read.
"""

from __future__ import annotations

import pytest

from gpufleet.clock import iso
from gpufleet.errors import ConfigError, Conflict
from gpufleet.safety.profile import SafetyProfile
from gpufleet.store.admin import AuditRecord, Change, Ref
from gpufleet.tables import SAFETY_SK, safety_profile_pk, tenant_pk

OPERATOR = "arn:aws:iam::1:user/op"


def _set(backend, tenant: str, n: int, expected: int, **fields) -> None:
    """What the admin service's ``set_safety`` writes: the validated profile, the version left to the store."""
    profile = SafetyProfile(
        tenant=tenant, version=expected + 1, updated_at=iso(backend.clock.now()), updated_by=OPERATOR, **fields
    )
    attrs = {"type": "safety_profile", **profile.model_dump(mode="json", exclude={"version"})}
    backend.admin.write(
        Change(Ref("safety", tenant), attrs, expected_version=expected),
        AuditRecord(at=f"2026-12-02T00:00:{n:02d}Z", id=f"a{n}", actor=OPERATOR, action="safety.set", target=tenant),
    )


def test_no_profile_resolves_to_the_deployment_default(backend):
    assert backend.safety.get("kids") is None
    frozen = backend.safety.resolve("kids")
    assert (frozen.source, frozen.profile_version, frozen.frame_thresholds, frozen.max_frames) == (
        "default",
        0,
        {},
        None,
    )
    assert frozen.resolved_at == iso(backend.clock.now())


def test_admin_writes_are_read_back_version_by_version(backend):
    _set(backend, "kids", 1, 0, frame_thresholds={"exposed_skin": 0.03}, max_frames=4)
    got = backend.safety.get("kids")
    assert (got.tenant, got.version, got.frame_thresholds, got.max_frames, got.backend, got.updated_by) == (
        "kids",
        1,
        {"exposed_skin": 0.03},
        4,
        None,
        OPERATOR,
    )
    with pytest.raises(Conflict):  # the store's versioning: a second creator loses
        _set(backend, "kids", 2, 0, frame_thresholds={"exposed_skin": 0.5})
    backend.clock.advance(60)
    _set(backend, "kids", 3, 1, frame_thresholds={"exposed_skin": 0.05})
    frozen = backend.safety.resolve("kids")
    assert (frozen.source, frozen.profile_version, frozen.frame_thresholds, frozen.max_frames) == (
        "tenant",
        2,
        {"exposed_skin": 0.05},
        None,
    )
    assert frozen.resolved_at == iso(backend.clock.now())
    _set(backend, "kids", 4, 2)  # cleared: versions stay monotonic, the profile changes nothing
    cleared = backend.safety.get("kids")
    assert cleared.version == 3 and cleared.is_default()
    assert backend.safety.get("other") is None


def test_a_corrupt_stored_profile_fails_closed(backend):
    backend.set_attrs(
        "control",
        (safety_profile_pk("kids"), SAFETY_SK),
        {"tenant": "kids", "frame_thresholds": {"exposed_skin": 7}, "version": 1, "updated_at": "x"},
    )
    with pytest.raises(ConfigError, match="kids"):
        backend.safety.get("kids")
    with pytest.raises(ConfigError):
        backend.safety.resolve("kids")


def test_a_profile_at_the_old_key_is_not_read(backend):
    backend.set_attrs(
        "control",
        (tenant_pk("kids"), SAFETY_SK),
        {"tenant": "kids", "frame_thresholds": {"exposed_skin": 0.1}, "version": 1, "updated_at": "x"},
    )
    assert backend.safety.get("kids") is None
    assert backend.safety.resolve("kids").source == "default"
