"""In-memory :class:`~gpufleet.store.safety_profiles.SafetyProfileStore`: CheckPrompt's reads of a tenant's
safety profile, from the item the administration store writes (``SAFETY#<tenant>`` / ``SAFETY``), validated
by the DynamoDB store's own :func:`~gpufleet.store.safety_profiles.profile_from_item` (a corrupt item fails
closed with :class:`~gpufleet.errors.ConfigError`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.clock import Clock, iso
from gpufleet.safety.profile import FrozenSafety, SafetyProfile, resolve
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.safety_profiles import SK, profile_from_item
from gpufleet.tables import safety_profile_pk


@dataclass
class MemorySafetyProfiles:
    db: MemoryDatabase
    clock: Clock
    table: str = "control"

    def get(self, tenant: str) -> SafetyProfile | None:
        return profile_from_item(tenant, self.db.get(self.table, (safety_profile_pk(tenant), SK)))

    def resolve(self, tenant: str) -> FrozenSafety:
        return resolve(self.get(tenant), iso(self.clock.now()))
