"""Model construction is one at a time in a process (gpufleet.models.tiny_wan.MODEL_CONSTRUCTION_LOCK): building the
tiny model and loading a pipeline both wait for it. Two batch members of a warm worker building and loading the
model at once produced meta tensors ("Cannot copy out of meta tensor") and a SYSTEM_ERROR."""

from __future__ import annotations

import threading

from gpufleet.models.loader import load_pipeline
from gpufleet.models.tiny_wan import MODEL_CONSTRUCTION_LOCK, save_tiny_wan


def _blocked_until_released(target) -> object:
    box: dict = {}
    with MODEL_CONSTRUCTION_LOCK:
        t = threading.Thread(target=lambda: box.setdefault("out", target()), daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive() and "out" not in box  # waits for the lock another thread holds
    t.join(60)
    assert not t.is_alive()
    return box["out"]


def test_building_and_loading_wait_for_the_construction_lock(tmp_path):
    folder = _blocked_until_released(lambda: save_tiny_wan(tmp_path / "wan-tiny"))
    assert (folder / "model_index.json").exists()
    pipe = _blocked_until_released(lambda: load_pipeline(folder))
    assert not any(p.is_meta for p in pipe.transformer.parameters())
