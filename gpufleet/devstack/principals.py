"""The dev stack's IAM stand-in: local principals, each with its own access key and CLI profile.

In AWS an operator creates an IAM user or role and its credentials with IAM, then maps its ARN to a tenant,
team and user with the administration API. Locally, :func:`add_principal` is the IAM half: it mints an
access key for ``arn:aws:iam::<dev account>:user/<name>``, stores it under ``<state>/credentials/<key id>.json``
(mode 0600) and writes a profile ``<state>/profiles/<name>.json`` (mode 0600) for the running stack's
endpoint. The stack's gateway accepts every key in that folder (:class:`gpufleet.devstack.gateway.CredentialBook`), so a principal
added while the stack runs can sign requests at once; what it may do is then the API's decision (an ARN
not onboarded gets 403). Adding a name again returns its existing profile.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from gpufleet.devstack.gateway import LocalCredential
from gpufleet.devstack.settings import DEV_ACCOUNT
from gpufleet.errors import ConfigError, ValidationFailed
from gpufleet.profile import Profile, load_profile, write_profile

CREDENTIALS_DIR = "credentials"
PROFILES_DIR = "profiles"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def principal_arn(name: str) -> str:
    return f"arn:aws:iam::{DEV_ACCOUNT}:user/{name}"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def store_credential(state: Path, cred: LocalCredential) -> Path:
    """Keep ``cred`` where the running gateway finds it."""
    path = state / CREDENTIALS_DIR / f"{cred.access_key_id}.json"
    _write_private(path, cred.model_dump_json())
    return path


def add_principal(state: Path, name: str, *, base_profile: Profile | None = None) -> tuple[str, Path]:
    """Mint ``name``'s access key and profile (see the module doc); returns (ARN, profile path).

    ``base_profile`` (default: the running stack's ``<state>/profile.json``) gives the endpoint, region and
    trust anchors."""
    if not _NAME.match(name or ""):
        raise ValidationFailed("a principal name is 1-63 of A-Za-z0-9._- starting with a letter or digit")
    target = state / PROFILES_DIR / f"{name}.json"
    if target.exists():
        return principal_arn(name), target
    if base_profile is None:
        try:
            base_profile = load_profile(state / "profile.json")
        except ConfigError as err:
            raise ConfigError(f"no running dev stack in {state} (start `gpufleet dev` first): {err.detail}")
    cred = LocalCredential(access_key_id="AKIALOCAL" + secrets.token_hex(8).upper(),
                           secret_access_key=secrets.token_urlsafe(30), principal_arn=principal_arn(name))
    store_credential(state, cred)
    profile = base_profile.model_copy(update={"access_key_id": cred.access_key_id,
                                              "secret_access_key": cred.secret_access_key, "session_token": None})
    write_profile(profile, target)
    return cred.principal_arn, target
