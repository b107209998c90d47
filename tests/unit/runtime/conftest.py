"""Shared by the runtime's unit tests: the tiny Wan pipeline, built once per test process (~3 s)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pipe():
    """``build_tiny_wan()`` on one CPU thread; tests reset what they use (``denoise.start`` reseeds and resets
    the scheduler), so one pipeline serves them all."""
    import torch

    from gpufleet.models.tiny_wan import build_tiny_wan

    torch.set_num_threads(1)
    return build_tiny_wan()
