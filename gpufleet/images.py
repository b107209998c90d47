"""The site's image allowlist (pure): which container images a job may name, by registry prefix or digest.

Contract:
- :func:`normalize` turns a reference into ``(repository, tag, digest)`` the way OCI tools
  resolve short names: ``alpine:3.20`` is ``docker.io/library/alpine:3.20``, ``team/x`` is
  ``docker.io/team/x``; a first component with a ``.`` or ``:`` or equal to ``localhost`` is a
  registry host. ``localhost/`` names images that exist only in a node's local store
  (``podman import``/``load``): no registry is involved.
- An allowlist entry is either
  - a repository prefix, matched on path-component boundaries after normalizing both:
    ``localhost/`` or ``localhost`` (every local image; a registry host alone has a ``.`` or
    ``:`` or is ``localhost``), ``registry.example.com/team-a``
    (that namespace and below, not ``team-ab``), ``docker.io/library/python`` (that one
    repository, any tag); or
  - a digest, ``sha256:<64 hex>``: any reference pinned to that digest (``...@sha256:<hex>``); or
    ``<repository>@sha256:<64 hex>``: exactly that repository at that digest.
- :func:`allowed` is true when any entry matches. An empty list allows nothing.
- :func:`check_allowlist_entry` validates an entry (settings call it at start-up).
"""

from __future__ import annotations

import re

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REF = re.compile(r"^(?P<name>[^@]+?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
#: a registry host (optionally with a port), then path components; a trailing / is allowed
_PREFIX = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*/?$")
DEFAULT_REGISTRY = "docker.io"


def _normalize_name(name: str) -> str:
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return name
    if not rest:
        return f"{DEFAULT_REGISTRY}/library/{name}"
    return f"{DEFAULT_REGISTRY}/{name}"


def normalize(ref: str) -> tuple[str, str | None, str | None]:
    """``(repository, tag, digest)`` of an image reference (ValueError if it is not one)."""
    m = _REF.match(ref.strip())
    if not m or not m.group("name") or m.group("name").endswith("/"):
        raise ValueError(f"invalid image reference {ref!r}")
    return _normalize_name(m.group("name")), m.group("tag"), m.group("digest")


def check_allowlist_entry(entry: str) -> str:
    """``entry`` if it is a valid allowlist entry (digest, repository@digest or repository prefix)."""
    if _DIGEST.match(entry):
        return entry
    name, _, digest = entry.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ValueError(f"invalid digest in image allowlist entry {entry!r}")
    if not _PREFIX.match(name):
        raise ValueError(f"invalid image allowlist entry {entry!r} (a repository prefix or a sha256 digest)")
    return entry


def _matches(entry: str, repo: str, digest: str | None) -> bool:
    if _DIGEST.match(entry):
        return digest == entry
    name, _, want = entry.partition("@")
    if want:
        return digest == want and repo == normalize(name)[0]
    prefix = name.rstrip("/")
    if "/" not in prefix and ("." in prefix or ":" in prefix or prefix == "localhost"):
        return repo.startswith(prefix + "/")  # a registry host alone (localhost, registry.example.com)
    prefix = _normalize_name(prefix)
    return repo == prefix or repo.startswith(prefix + "/")


def allowed(ref: str, allowlist: list[str] | tuple[str, ...]) -> bool:
    """True when ``ref`` matches an entry of ``allowlist`` (see the module contract)."""
    try:
        repo, _tag, digest = normalize(ref)
    except ValueError:
        return False
    return any(_matches(e, repo, digest) for e in allowlist)
