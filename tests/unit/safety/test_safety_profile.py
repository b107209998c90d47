"""Pure logic of tenant safety profiles: validation, resolution, threshold overrides in the frame moderator."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gpufleet.errors import ConfigError
from gpufleet.safety.frame_selection import DEFAULT_MAX_FRAMES
from gpufleet.safety.frames import moderator
from gpufleet.safety.profile import FrozenSafety, SafetyProfile, parse_thresholds, resolve

AT = "2026-01-01T00:00:00.000Z"


def _profile(**kw) -> SafetyProfile:
    return SafetyProfile(**{"tenant": "kids-edu", "version": 1, "updated_at": AT, **kw})


@pytest.mark.parametrize("value", [0.0, -0.1, 1.01, float("nan")])
def test_thresholds_must_lie_in_zero_one(value):
    with pytest.raises(ValidationError):
        _profile(frame_thresholds={"exposed_skin": value})


def test_threshold_of_one_and_tiny_thresholds_are_valid():
    assert _profile(frame_thresholds={"exposed_skin": 1.0}).frame_thresholds == {"exposed_skin": 1.0}
    assert _profile(frame_thresholds={"exposed_skin": 0.001}).frame_thresholds["exposed_skin"] == 0.001


def test_categories_must_be_scored_by_the_backend():
    with pytest.raises(ValidationError, match="unknown moderation categories"):
        _profile(frame_thresholds={"exposed-skin": 0.1})  # a typo never passes silently
    with pytest.raises(ValidationError, match="unknown moderation categories"):
        _profile(frame_thresholds={"exposed_skin": 0.1}, backend="nudenet")
    with pytest.raises(ValidationError, match="unknown moderation backend"):
        _profile(backend="nope")
    assert _profile(frame_thresholds={"nudity": 0.2}, backend="nudenet").backend == "nudenet"
    assert _profile(frame_thresholds={"nudity": 0.2}).backend is None  # some backend scores it


@pytest.mark.parametrize("field,value", [("max_frames", 1), ("max_frames", 65), ("version", 0), ("tenant", "a b"),
                                         ("extra", 1)])
def test_other_fields_are_validated(field, value):
    with pytest.raises(ValidationError):
        _profile(**{field: value})


def test_no_profile_resolves_to_the_deployment_default():
    frozen = resolve(None, AT)
    assert frozen.as_item() == {"source": "default", "profile_version": 0, "frame_thresholds": {}, "backend": None,
                                "max_frames": None, "resolved_at": AT}
    m = frozen.moderator("skin")
    assert m.backend.thresholds == {"exposed_skin": 0.6} and m.sampling.max_frames == DEFAULT_MAX_FRAMES


def test_a_profile_resolves_to_its_settings_and_builds_that_moderator():
    frozen = resolve(_profile(frame_thresholds={"exposed_skin": 0.03}, max_frames=4, version=3), AT)
    assert (frozen.source, frozen.profile_version, frozen.frame_thresholds) == ("tenant", 3, {"exposed_skin": 0.03})
    m = frozen.moderator("skin")
    assert m.backend.name == "skin" and m.backend.thresholds == {"exposed_skin": 0.03}
    assert m.sampling.max_frames == 4


def test_a_cleared_profile_changes_nothing_but_keeps_its_version():
    cleared = _profile(version=5)
    assert cleared.is_default()
    frozen = resolve(cleared, AT)
    assert frozen.profile_version == 5 and frozen.moderator("skin").backend.thresholds == {"exposed_skin": 0.6}


def test_frozen_threshold_the_backend_cannot_apply_fails_closed():
    frozen = FrozenSafety(source="tenant", profile_version=2, frame_thresholds={"exposed_skin": 0.03})
    with pytest.raises(ConfigError, match="does not score exposed_skin"):
        frozen.moderator("nudenet")


def test_frozen_settings_read_back_from_an_item_ignore_unknown_keys():
    item = {"source": "tenant", "profile_version": 2, "frame_thresholds": {"exposed_skin": 0.1}, "backend": None,
            "max_frames": None, "resolved_at": AT, "later_field": "x"}
    assert FrozenSafety.model_validate(item).frame_thresholds == {"exposed_skin": 0.1}


def _frames(skin_share: float, n: int = 6) -> np.ndarray:
    frames = np.zeros((n, 20, 20, 3), dtype=np.uint8)
    frames[...] = (40, 60, 200)  # blue: no skin tone
    k = int(round(skin_share * 400))
    flat = frames.reshape(n, 400, 3)
    flat[:, :k] = (224, 172, 140)  # a skin tone
    return frames


def test_override_decides_the_verdict_and_is_recorded():
    frames = _frames(0.05)
    default = moderator("skin").moderate(frames)
    strict = moderator("skin", thresholds={"exposed_skin": 0.03}).moderate(frames)
    assert default.scores["exposed_skin"] == pytest.approx(0.05)
    assert not default.blocked and default.as_dict()["thresholds"] == {"exposed_skin": 0.6}
    assert strict.blocked and strict.category == "exposed_skin"
    assert strict.as_dict()["thresholds"] == {"exposed_skin": 0.03}


def test_moderator_rejects_an_override_for_a_category_the_backend_does_not_score():
    with pytest.raises(ConfigError):
        moderator("skin", thresholds={"nudity": 0.1})


def test_parse_thresholds():
    assert parse_thresholds(["exposed_skin=0.03", " nudity = 0.5"]) == {"exposed_skin": 0.03, "nudity": 0.5}
    for bad in (["exposed_skin"], ["=0.1"], ["exposed_skin=x"]):
        with pytest.raises(ValueError):
            parse_thresholds(bad)
