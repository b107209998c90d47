"""``gpufleet agent --scrub-cache``: hash the node cache in full, remove what no longer matches, say so in JSON and in
the exit code (0 clean, 1 corrupt entries found, 2 no cache where the settings say)."""

from __future__ import annotations

import argparse
import hashlib
import json

import tomli_w

from gpufleet.clock import SystemClock
from gpufleet.runtime.hostcache import ContentCache
from onprem_agent.main import run


def _args(config) -> argparse.Namespace:
    return argparse.Namespace(config=str(config), check=False, node_id=None, scrub_cache=True)


def _config(tmp_path, cache_dir) -> str:
    p = tmp_path / "agent.toml"
    p.write_text(tomli_w.dumps({"node_id": "node-1", "pool": "onprem-a", "queue_url": "https://sqs.example/q",
                                "state_dir": str(tmp_path / "state"), "cache_dir": str(cache_dir)}))
    return str(p)


def test_scrub_reports_and_removes_a_corrupt_entry(tmp_path, capsys):
    cache = ContentCache(tmp_path / "cache", max_bytes=10_000, clock=SystemClock())
    keys = []
    for fill in (b"a", b"b"):
        src = tmp_path / f"src-{fill.decode()}"
        src.write_bytes(fill * 500)
        keys.append(hashlib.sha256(fill * 500).hexdigest())
        cache.put(keys[-1], src)
    config = _config(tmp_path, tmp_path / "cache")
    assert run(_args(config)) == 0
    clean = json.loads(capsys.readouterr().out)
    assert (clean["entries"], clean["bytes"], clean["corrupt"]) == (2, 1000, 0)

    bad = cache.path(keys[1])
    bad.chmod(0o644)
    bad.write_bytes(b"z" * 500)
    assert run(_args(config)) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["corrupt"] == 1 and found["removed"] == [keys[1]] and not bad.exists()
    assert cache.path(keys[0]).exists()


def test_no_cache_where_the_settings_say_is_exit_2(tmp_path, capsys):
    assert run(_args(_config(tmp_path, tmp_path / "missing"))) == 2
    assert "no node cache at" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()  # a scrub creates nothing
