"""The model catalog's registration rule (pure): which hash a registration records, and the names it accepts."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpufleet.cli.admin_models import catalog_state, merged
from gpufleet.errors import Conflict, NotFound, ValidationFailed
from gpufleet.models.catalog import Published, checked_name, name_problem, parse_manifest, registration
from gpufleet.models.loader import PublishedModel

H1, H2 = "1" * 64, "2" * 64


def test_a_published_manifest_decides_and_a_differing_hash_is_a_conflict_naming_both():
    published = Published(H1, 3)
    assert registration("m", None, published, "s3://b/models/") == {"content_hash": H1, "files": 3, "bytes": 0,
                                                                      "source": "published"}
    assert registration("m", H1, published, "s3://b/models/")["content_hash"] == H1
    with pytest.raises(Conflict) as err:
        registration("m", H2, published, "s3://b/models/")
    assert H1 in err.value.detail and H2 in err.value.detail


def test_an_unpublished_model_needs_its_hash():
    assert registration("m", H2, None, "s3://b/models/") == {"content_hash": H2, "files": 0, "bytes": 0,
                                                             "source": "local"}
    with pytest.raises(NotFound, match="not published under s3://b/models/"):
        registration("m", None, None, "s3://b/models/")


def test_a_manifest_is_parsed_and_hashed_as_published():
    raw = json.dumps({"files": {"a.bin": H1, "b/c.json": H2}}, sort_keys=True, separators=(",", ":")).encode()
    assert parse_manifest("m", raw) == Published(hashlib.sha256(raw).hexdigest(), 2)
    for bad in (b"nope", b"[]", b'{"files": []}', b'{"files": {"a": "xyz"}}'):
        with pytest.raises(Conflict):
            parse_manifest("m", bad)


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", " padded", "tab\there", "x" * 257])
def test_names_a_job_could_not_give_are_refused(name):
    assert name_problem(name) and name_problem(name, registering=False)
    with pytest.raises(ValidationFailed):
        checked_name(name)


def test_the_built_in_model_is_never_registered_but_is_a_valid_name():
    assert "built in" in name_problem("wan-tiny")
    assert name_problem("wan-tiny", registering=False) is None
    assert name_problem("Wan2.1-T2V_14B") is None and name_problem("x" * 256) is None


def test_list_states_merge_the_catalog_with_the_bucket():
    assert [catalog_state(r, p) for r, p in ((H1, H1), (None, H1), (H1, H2), (H1, None))] == [
        "registered", "not registered", "differs", "local"]
    rows = merged([{"name": "a", "content_hash": H1, "files": 0, "bytes": 0, "version": 2}],
                  [PublishedModel("b", H2, 3, 99)], "s3://b/models/")
    assert [(r["name"], r["state"], r["registered_hash"], r["published_hash"], r["uri"]) for r in rows] == [
        ("a", "local", H1, None, None), ("b", "not registered", None, H2, "s3://b/models/b/")]
