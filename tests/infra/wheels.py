"""Wheel platform tags of installed distributions, and the glibc they need (infra tests' helper)."""

from __future__ import annotations

import re


def wheel_tags(dist) -> list[str]:
    """The ``Tag:`` lines of an installed distribution's WHEEL file."""
    return [ln.split(":", 1)[1].strip() for ln in (dist.read_text("WHEEL") or "").splitlines() if ln.startswith("Tag:")]


def glibc_needed(tags: list[str]) -> tuple[int, int]:
    """The lowest glibc on which a wheel with these tags installs ((0, 0): not glibc-specific)."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    needs = []
    for tag in tags:
        platform = tag.split("-")[-1]
        m = re.match(r"manylinux_(\d+)_(\d+)_", platform)
        if m:
            needs.append((int(m[1]), int(m[2])))
        elif platform.split("_")[0] in legacy:
            needs.append(legacy[platform.split("_")[0]])
        else:
            needs.append((0, 0))
    return min(needs) if needs else (0, 0)
