"""Pure runtime logic: checkpoint cadence, delivery size, watermark payload, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.envelope import ExitCode
from gpufleet.errors import BadRequest, Cancelled, ConfigError, NotFound, StaleEpoch, TransientError, ValidationFailed
from gpufleet.provenance.video import delivery_size
from gpufleet.provenance.watermark import PAYLOAD_BITS, bits_to_hex, payload_for_job, payload_hex
from gpufleet.runtime.checkpoint import CheckpointPolicy
from gpufleet.runtime.container import pack_dir, unpack_dir
from gpufleet.runtime.generate import generation_request
from gpufleet.runtime.main import classify
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.safety.frames import moderator
from gpufleet.spec import VideoGenerate
from gpufleet.store.objectstore import parse_s3_uri


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 100), st.floats(0, 1000))
def test_checkpoint_policy_is_due_exactly_when_a_limit_is_reached(every_steps, steps, every_s, seconds):
    due = CheckpointPolicy(every_steps, float(every_s)).due(steps, seconds)
    assert due == ((every_steps > 0 and steps >= every_steps) or (every_s > 0 and seconds >= every_s))


@given(st.integers(16, 1920), st.integers(16, 1920))
def test_delivery_size_reaches_the_watermark_minimum_and_keeps_the_aspect(w, h):
    dw, dh = delivery_size(w, h, 256)
    assert min(dw, dh) >= 256 and dw % 2 == 0 and dh % 2 == 0
    assert abs(dw / dh - w / h) <= 0.02 * (w / h) + 2 / min(dw, dh)
    if min(w, h) >= 256:
        assert (dw, dh) == (w + w % 2, h + h % 2)


@settings(max_examples=50)
@given(st.text(min_size=1, max_size=40))
def test_watermark_payload_is_48_bits_and_a_function_of_the_job_id(job_id):
    bits = payload_for_job(job_id)
    assert len(bits) == PAYLOAD_BITS and set(bits) <= {0, 1}
    assert payload_for_job(job_id) == bits
    assert len(payload_hex(job_id)) == 12 and bits_to_hex(bits) == payload_hex(job_id)


def test_distinct_jobs_get_distinct_payloads():
    assert len({payload_hex(f"job_{i}") for i in range(2000)}) == 2000


@pytest.mark.parametrize(("err", "code"), [
    (StaleEpoch("x"), ExitCode.FENCED),
    (Cancelled("x"), ExitCode.CANCELLED),
    (ValidationFailed("x"), ExitCode.USER_ERROR),
    (BadRequest("x"), ExitCode.USER_ERROR),
    (NotFound("model"), ExitCode.USER_ERROR),
    (TransientError("x"), ExitCode.SYSTEM_ERROR),
    (ConfigError("x"), ExitCode.SYSTEM_ERROR),
    (RuntimeError("x"), ExitCode.SYSTEM_ERROR),
])
def test_errors_classify_into_exit_codes(err, code):
    assert classify(err) == code


def test_tiny_model_generates_small_and_other_models_at_the_requested_size():
    tiny = generation_request(VideoGenerate(prompt="p", width=512, height=256), tiny_side=64)
    assert (tiny.width, tiny.height) == (64, 32) and tiny.max_sequence_length == 16
    big = generation_request(VideoGenerate(prompt="p", model="wan-1.3b", width=512, height=256), tiny_side=64)
    assert (big.width, big.height) == (512, 256)
    assert tiny.fingerprint("a") != tiny.fingerprint("b")


def test_settings_come_from_gpufleet_environment_variables():
    s = RuntimeSettings.load(env={"GPUFLEET_CHECKPOINT_EVERY_STEPS": "7", "GPUFLEET_TORCH_THREADS": "1",
                                  "GPUFLEET_STATE_DIR": "/tmp/x", "HOME": "/root"})
    assert s.checkpoint_every_steps == 7 and s.torch_threads == 1 and s.cache_path == Path("/tmp/x/cache")
    with pytest.raises(ConfigError):
        RuntimeSettings.load(env={"GPUFLEET_CHECKPOINT_EVERY_STEPS": "-1"})


def test_s3_uris_parse_with_optional_version():
    assert parse_s3_uri("s3://b/k/x.bin?versionId=v1") == ("b", "k/x.bin", "v1")
    assert parse_s3_uri("s3://b/k") == ("b", "k", None)
    with pytest.raises(ValueError):
        parse_s3_uri("https://b/k")


def test_checkpoint_dir_tar_is_deterministic_and_round_trips(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(b"\x00\x01")
    first = pack_dir(src)
    (src / "a.txt").touch()  # a new mtime does not change the archive
    assert pack_dir(src) == first
    unpack_dir(first, tmp_path / "dst")
    assert (tmp_path / "dst" / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    (src / "a.txt").write_text("beta")
    assert pack_dir(src) != first


def test_unknown_moderation_backend_is_a_config_error():
    with pytest.raises(ConfigError):
        moderator("no-such-backend")
