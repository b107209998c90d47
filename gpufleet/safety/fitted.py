"""The fitted state of a policy (exemplar embeddings and the logistic head) saved beside the policy file.

Contract: building a :class:`gpufleet.safety.PromptFilter` embeds every exemplar
(and, with the head's ``augment``, their evasion variants) and fits the head:
tens of seconds on a small CPU. :func:`save` writes that state to
``<policy>.fitted.npz`` with a ``digest`` of the encoder's weights hash and the
policy's JSON; :func:`load` returns it only when the digest matches (else None,
and the filter fits afresh), so an edited policy is never judged by stale
weights. ``python -m gpufleet.safety.fit [POLICY]`` writes the file for a
policy (default: the packaged one, whose file ships with the package).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.safety.policy import DEFAULT_POLICY_PATH, Policy


def fitted_path(policy_path: str | os.PathLike | None) -> Path:
    p = Path(policy_path) if policy_path else DEFAULT_POLICY_PATH
    return p.with_name(p.stem + ".fitted.npz")


_SPELLER_OPTIONS = (
    "spelling_unsafe_margin",
    "spelling_split_article",
    "spelling_english_only",
    "spelling_margin_substitutions_only",
    "spelling_english_candidates",
)


def digest(policy: Policy, model_hash: str) -> str:
    # a policy without n-gram features, per-category or per-condition thresholds or a long-prompt floor digests as it
    # did before those fields existed, so saved states stay valid
    unset = (
        {
            f
            for f in ("ngrams", "category_thresholds", "long_min_similarity", "condition_thresholds")
            if getattr(policy.logistic, f) is None
        }
        if policy.logistic
        else set()
    )
    exclude: dict[str, Any] = {"logistic": unset} if unset else {}
    # the same for the speller options, at their defaults
    exclude.update({f: True for f in _SPELLER_OPTIONS if getattr(policy, f) == Policy.model_fields[f].default})
    text = policy.model_dump_json(exclude=exclude or None)
    return hashlib.sha256(f"{model_hash}\n{text}".encode()).hexdigest()


def save(path: Path, policy: Policy, model_hash: str, arrays: dict[str, np.ndarray]) -> None:
    with path.open("wb") as f:
        np.savez_compressed(f, digest=np.array(digest(policy, model_hash)), **arrays)


def load(path: Path, policy: Policy, model_hash: str) -> dict[str, np.ndarray] | None:
    """The arrays saved for exactly this policy and encoder, or None (no file, or a different digest)."""
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        if str(data["digest"]) != digest(policy, model_hash):
            return None
        return {k: data[k] for k in data.files if k != "digest"}
