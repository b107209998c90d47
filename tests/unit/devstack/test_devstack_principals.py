"""Local principals: each has its own key and profile; the gateway accepts a key stored after it started."""

from __future__ import annotations

import stat

import pytest

from gpufleet.devstack.gateway import CredentialBook, LocalCredential
from gpufleet.devstack.principals import CREDENTIALS_DIR, add_principal
from gpufleet.errors import ConfigError, ValidationFailed
from gpufleet.profile import Profile, load_profile


def test_a_principal_added_later_is_accepted_and_has_its_own_profile(tmp_path):
    base = Profile(endpoint="http://127.0.0.1:1", access_key_id="AKIADEV0000000000", secret_access_key="x")
    book = CredentialBook([LocalCredential(access_key_id="AKIADEV0000000000", secret_access_key="x",
                                           principal_arn="arn:aws:iam::123456789012:user/developer")],
                          tmp_path / CREDENTIALS_DIR)
    arn, path = add_principal(tmp_path, "bob", base_profile=base)
    assert arn == "arn:aws:iam::123456789012:user/bob"
    prof = load_profile(path)
    assert prof.access_key_id != base.access_key_id and prof.endpoint == base.endpoint
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cred = book.get(prof.access_key_id)
    assert cred is not None and cred.principal_arn == arn and cred.secret_access_key == prof.secret_access_key
    assert add_principal(tmp_path, "bob", base_profile=base) == (arn, path)  # again: the same profile
    assert book.get("AKIANOSUCHKEY00000") is None
    assert book.get("../../etc/passwd") is None


def test_bad_names_and_no_stack_are_refused(tmp_path):
    with pytest.raises(ValidationFailed):
        add_principal(tmp_path, "../x")
    with pytest.raises(ConfigError):
        add_principal(tmp_path, "bob")  # no running stack: no profile.json to copy the endpoint from
