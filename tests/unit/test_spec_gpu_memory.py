"""``resources.gpu_memory_gb`` is honoured through the GPU model, or refused naming the models that fit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.spec import GPU_MEMORY_GB, GPU_TYPES, JobSpec, gpu_models_with

BASE = {"workload": {"kind": "video.generate", "prompt": "a fox"}}


def spec(**resources):
    return JobSpec.model_validate({**BASE, "resources": resources})


@pytest.mark.parametrize("gpu_type", [t for t in GPU_TYPES if t in GPU_MEMORY_GB])
@pytest.mark.parametrize("want", [8, 16, 24, 40, 80, 141])
def test_a_model_with_enough_memory_is_accepted_any_other_refused(gpu_type, want):
    if GPU_MEMORY_GB[gpu_type] >= want:
        assert spec(gpu_type=gpu_type, gpu_memory_gb=want).resources.gpu_memory_gb == want
    else:
        with pytest.raises(ValidationError, match=gpu_models_with(want)[0]):
            spec(gpu_type=gpu_type, gpu_memory_gb=want)


def test_any_model_or_an_impossible_amount_is_refused_clearly():
    with pytest.raises(ValidationError, match="needs a gpu_type with that much memory: one of A100, L40S"):
        spec(gpu_memory_gb=40)
    with pytest.raises(ValidationError, match="no GPU model has that much memory"):
        spec(gpu_type="H200", gpu_memory_gb=200)
    with pytest.raises(ValidationError, match="unknown"):
        spec(gpu_type="G1", gpu_memory_gb=1)
    assert spec(gpu_type="any").resources.gpu_memory_gb is None
