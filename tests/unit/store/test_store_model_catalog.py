"""Submission's model-catalog rule (gpufleet.store.model_catalog.pinned_model) and the pin's way to the runtime: the
lifecycle's envelope carries the job's ``model_hash`` in both forms (the pointer the Batch command and the node's
message hold, and the whole one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpufleet.envelope import Envelope
from gpufleet.errors import ValidationFailed
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle.settings import LifecycleSettings
from gpufleet.lifecycle.steps import envelope_for
from gpufleet.placement import Placement
from gpufleet.spec import JobSpec
from gpufleet.store.model_catalog import MODEL_HASH, MemoryModelCatalog, pinned_model

HASH = "ef" * 32


def _workload(**kw):
    return JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "a fox", **kw}}).workload


def test_a_registered_model_pins_its_hash_and_built_ins_pin_nothing():
    catalog = MemoryModelCatalog({"wan-1.3b": HASH})
    assert pinned_model(catalog, _workload(model="wan-1.3b")) == {MODEL_HASH: HASH}
    assert pinned_model(catalog, _workload()) == {} == pinned_model(None, _workload(model="wan-tiny"))
    container = JobSpec.model_validate({"workload": {"kind": "container", "image": "localhost/x:1",
                                                     "command": ["true"]}}).workload
    assert pinned_model(None, container) == {}


@pytest.mark.parametrize("catalog", [MemoryModelCatalog({"other": HASH}), MemoryModelCatalog(), None])
def test_a_model_outside_the_catalog_is_a_validation_error_naming_the_field(catalog):
    with pytest.raises(ValidationFailed) as err:
        pinned_model(catalog, _workload(model="wan-14b"))
    assert err.value.extra["field"] == "workload.model" and "wan-14b" in err.value.detail


def test_the_envelope_carries_the_pin_in_both_forms():
    deps = SimpleNamespace(settings=LifecycleSettings())
    placement = Placement.model_validate({"epoch": 1, "attempt": 1, "target": "cloud", "pool": "cloud-ondemand"})
    job = JobRecord.from_item({"job_id": "job_1", "tenant": "t", "team": "a", "user": "u", "status": "SCHEDULED",
                               "spec": {"workload": {"kind": "video.generate", "prompt": "a fox", "model": "m"}},
                               "priority": 0, "created_at": "2026-01-01T00:00:00Z",
                               "updated_at": "2026-01-01T00:00:00Z", MODEL_HASH: HASH})
    env = envelope_for(deps, job, placement, "generate")
    assert env.model_hash == HASH
    assert Envelope.model_validate_json(env.pointer().model_dump_json(exclude_none=True)).model_hash == HASH
    unpinned = job.model_copy(update={"model_hash": None})
    assert envelope_for(deps, unpinned, placement, "generate").model_hash is None
    with pytest.raises(ValueError):
        Envelope.model_validate({**env.model_dump(mode="json"), "model_hash": "not-a-hash"})
