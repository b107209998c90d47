"""The image allowlist matcher: short names normalize as OCI tools resolve them, prefixes match on path
boundaries, digests match only pinned references."""

from __future__ import annotations

import pytest

from gpufleet.images import allowed, check_allowlist_entry, normalize

D = "sha256:" + "0f" * 32


def test_normalize_resolves_short_names():
    assert normalize("alpine") == ("docker.io/library/alpine", None, None)
    assert normalize("team/x:1") == ("docker.io/team/x", "1", None)
    assert normalize("localhost/a/b:2") == ("localhost/a/b", "2", None)
    assert normalize(f"r.example:5000/a@{D}") == ("r.example:5000/a", None, D)
    with pytest.raises(ValueError):
        normalize("a/")


@pytest.mark.parametrize(("ref", "entries", "ok"), [
    ("localhost/gpufleet-test/tools:1", ["localhost/"], True),
    ("localhost/gpufleet-test/tools:1", ["localhost"], True),
    ("localhost/gpufleet-test/tools:1", ["localhost/gpufleet-test"], True),
    ("localhost/gpufleet-testx/tools:1", ["localhost/gpufleet-test"], False),
    ("localhost:5000/a", ["localhost/"], False),
    ("alpine:3.20", ["localhost/"], False),
    ("alpine:3.20", ["docker.io/library/alpine"], True),
    ("alpine:3.20", ["alpine"], True),  # an entry normalizes like a reference
    ("evil.example/localhost/a", ["localhost/"], False),
    (f"anything/at:all@{D}", [D], True),
    ("anything/at:all", [D], False),
    (f"ubuntu@{D}", [f"docker.io/library/ubuntu@{D}"], True),
    (f"debian@{D}", [f"docker.io/library/ubuntu@{D}"], False),
    ("localhost/a", [], False),
    ("not a ref", ["localhost/"], False),
])
def test_allowed(ref, entries, ok):
    assert allowed(ref, entries) is ok


@pytest.mark.parametrize("entry", ["", "/", "a b", "sha256:xyz", "localhost/@sha256:12"])
def test_invalid_entries_are_refused(entry):
    with pytest.raises(ValueError):
        check_allowlist_entry(entry)
