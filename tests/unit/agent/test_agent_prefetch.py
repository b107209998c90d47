"""Prefetch: a held job's inputs and model reach the node cache before it starts, so the runtime's staging
and model load are hits; one job at a time, stopped when its message is no longer held, and never failing a
job. Fakes only (an in-memory object store, a fake SQS client and node API): no AWS, no process."""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time

import pytest

from gpufleet.clock import SystemClock
from gpufleet.envelope import Envelope
from gpufleet.errors import TaskGone
from gpufleet.models.loader import ModelChanged, ModelLoader, Stopped, folder_manifest, manifest_bytes
from gpufleet.runtime.staging import Stager
from onprem_agent.agent import Agent
from onprem_agent.aws import Message
from onprem_agent.gpus import discover
from onprem_agent.prefetch import Prefetcher, Prefilled, cache_filler
from onprem_agent.runner import request_for
from onprem_agent.settings import AgentSettings

MODELS = "s3://models/pub/"
INPUT = "s3://data/tenants/t/clip.bin?versionId=v2"


class FakeObjects:
    """The ObjectStore calls staging and the model loader make, over a dict; ``gate`` holds a download of a
    key until set; every download is counted by key."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads: dict[str, int] = {}
        self.gate: dict[str, threading.Event] = {}
        self.waiting = threading.Event()

    def _body(self, bucket: str, key: str) -> bytes:
        return self.objects[f"s3://{bucket}/{key}"]

    def get_bytes(self, bucket: str, key: str, version: str | None = None) -> bytes:
        from gpufleet.errors import NotFound

        try:
            return self._body(bucket, key)
        except KeyError:
            raise NotFound(key) from None

    def head(self, bucket: str, key: str, version: str | None = None) -> dict:
        return {"ETag": hashlib.md5(self._body(bucket, key)).hexdigest(), "VersionId": version or "v1"}  # noqa: S324

    def download_to(self, bucket: str, key: str, fh: io.RawIOBase, version: str | None = None) -> int:
        gate = self.gate.get(key)
        if gate is not None:
            self.waiting.set()
            assert gate.wait(10)
        self.downloads[key] = self.downloads.get(key, 0) + 1
        body = self._body(bucket, key)
        fh.write(body)
        return len(body)


def _published(tmp_path) -> FakeObjects:
    folder = tmp_path / "m1"
    folder.mkdir()
    (folder / "model_index.json").write_text("{}")
    (folder / "w.bin").write_bytes(b"w" * 1000)
    objects = {f"{MODELS}m1/{rel}": (folder / rel).read_bytes() for rel in ("model_index.json", "w.bin")}
    objects[f"{MODELS}m1/manifest.json"] = manifest_bytes(folder_manifest(folder))
    objects["s3://data/tenants/t/clip.bin"] = b"c" * 500
    return FakeObjects(objects)


def _envelope(job_id: str = "j1", epoch: int = 1, inputs=(INPUT,), model: str = "m1") -> Envelope:
    return Envelope.model_validate(
        {
            "job_id": job_id,
            "attempt": epoch,
            "epoch": epoch,
            "stage": "generate",
            "spec": {
                "workload": {"kind": "video.generate", "prompt": "p", "model": model},
                "data": {"inputs": list(inputs)},
            },
            "s3": {
                "bucket_outputs": "b",
                "bucket_checkpoints": "b",
                "bucket_logs": "b",
                "output_prefix": f"jobs/{job_id}/",
                "checkpoint_prefix": f"jobs/{job_id}/",
                "log_prefix": f"jobs/{job_id}/attempt-0001/",
            },
        }
    )


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines():
    """The prefetcher's log records (its own handler: another test may stop the agent's loggers propagating)."""
    h, logger = _Lines(), logging.getLogger("onprem_agent.prefetch")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(h)
    yield h
    logger.removeHandler(h)
    logger.setLevel(old)


def _wait(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_a_held_jobs_inputs_and_model_are_cache_hits_when_it_starts(tmp_path, lines):
    objects, cache = _published(tmp_path), tmp_path / "cache"
    seen: list[tuple[str, int]] = []

    def store(job_id: str, epoch: int) -> FakeObjects:
        seen.append((job_id, epoch))  # the attempt's own credentials
        return objects

    outcomes: list[str] = []
    p = Prefetcher(
        cache_filler(cache_dir=cache, objects=store, model_root=None, model_s3_root=MODELS), outcome=outcomes.append
    )
    p.offer(_envelope())
    _wait(lambda: outcomes)
    p.close()
    assert outcomes == ["done"] and seen == [("j1", 1)]
    line = next(r for r in lines.records if r.msg == "prefetched")
    assert (line.job_id, line.model, line.inputs, line.input_bytes_moved, line.model_bytes_moved) == (
        "j1",
        "m1",
        1,
        500,
        1002,
    )
    moved = dict(objects.downloads)
    # the job starts: what the runtime's generate stage does — staging and the model load — moves nothing
    staged = Stager(objects, cache).stage([INPUT], cache / "jobs" / "j1" / "inputs")
    assert (staged.bytes_moved, staged.bytes_cached) == (0, 500)
    model = ModelLoader(cache, objects, None, MODELS).resolve("m1")
    assert model.bytes_downloaded == 0  # generate marks model_loaded with model_cache "hit"
    assert objects.downloads == moved


def test_a_job_starting_while_its_model_is_fetched_waits_for_it_and_hits(tmp_path):
    objects, cache = _published(tmp_path), tmp_path / "cache"
    objects.gate["pub/m1/w.bin"] = threading.Event()
    fill = cache_filler(cache_dir=cache, objects=lambda j, e: objects, model_root=None, model_s3_root=MODELS)
    prefetch = threading.Thread(target=fill, args=(_envelope(inputs=()), lambda: False))
    prefetch.start()
    assert objects.waiting.wait(10)  # the prefetch is downloading the weights
    got: list = []
    runtime = threading.Thread(target=lambda: got.append(ModelLoader(cache, objects, None, MODELS).resolve("m1")))
    runtime.start()
    runtime.join(0.3)
    assert runtime.is_alive()  # waiting on the model's cache lock, not downloading a second copy
    objects.gate["pub/m1/w.bin"].set()
    prefetch.join(10)
    runtime.join(10)
    assert got[0].bytes_downloaded == 0 and objects.downloads["pub/m1/w.bin"] == 1


def test_a_stopped_model_prefetch_leaves_nothing_behind(tmp_path):
    objects, cache = _published(tmp_path), tmp_path / "cache"
    calls = iter([False, True])
    with pytest.raises(Stopped):
        ModelLoader(cache, objects, None, MODELS).prefetch("m1", stop=lambda: next(calls))
    assert [p.name for p in (cache / "models" / "sha256").iterdir()] == []
    assert ModelLoader(cache, objects, None, None).prefetch("wan-tiny") is None  # built locally: nothing to fetch


def test_one_prefetch_at_a_time_in_order_stopped_when_released_and_a_failure_only_logged(lines):
    gates = {k: threading.Event() for k in ("a", "b", "c", "d")}
    running: list[str] = []
    calls: list[str] = []
    stops: dict[str, object] = {}

    def fill(env: Envelope, stop) -> Prefilled:
        running.append(env.job_id)
        assert len(running) == 1, "two prefetches at once"
        calls.append(env.job_id)
        stops[env.job_id] = stop
        try:
            if env.job_id == "d":
                raise OSError("disk full")
            while not gates[env.job_id].is_set() and not stop():
                time.sleep(0.005)
            return Prefilled(stopped=stop())
        finally:
            running.remove(env.job_id)

    outcomes: list[str] = []
    p = Prefetcher(fill, outcome=outcomes.append)
    for j in ("a", "b", "c", "d"):
        p.offer(_envelope(j))
    p.offer(_envelope("a"))  # offered once
    _wait(lambda: calls == ["a"])
    p.forget(("b", 1))  # started elsewhere (or dropped) before its turn: never fetched
    p.forget(("a", 1), stop=True)  # its message was released: the fetch in flight stops
    _wait(lambda: calls == ["a", "c"])
    assert outcomes == ["stopped"]
    p.forget(("c", 1))  # started: the fetch in flight goes on
    assert not stops["c"]()
    gates["c"].set()
    _wait(lambda: len(outcomes) == 3)
    assert calls == ["a", "c", "d"] and outcomes == ["stopped", "done", "failed"]
    assert any(r.msg.startswith("prefetch failed") and "disk full" in r.detail for r in lines.records)
    p.close()


class FakeSqs:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def change_message_visibility(self, **kw) -> dict:
        self.calls.append(f"visibility {kw['VisibilityTimeout']}")
        return {}

    def delete_message(self, **kw) -> dict:
        self.calls.append("delete")
        return {}


class FakeNodeApi:
    def __init__(self) -> None:
        self.gone: set[str] = set()

    def attempt(self, job_id: str, epoch: int, op: str, body=None) -> dict:
        if job_id in self.gone:
            raise TaskGone("gone")
        return {"current_epoch": epoch}


def test_the_agent_prefetches_a_held_job_and_stops_when_its_task_is_gone(tmp_path):
    s = AgentSettings(
        node_id="node-p",
        pool="p",
        queue_url="q",
        node_api_url="http://api",
        state_dir=tmp_path / "s",
        cache_dir=tmp_path / "c",
        metrics_enabled=False,
        cpu_slots=1,
    )
    api, sqs = FakeNodeApi(), FakeSqs()
    agent = Agent(s, clock=SystemClock(), environ={}, sqs=sqs, node_api=api, inventory=discover(cpu_slots=1))
    assert agent.prefetcher is not None
    fetched: list[str] = []

    def fill(env: Envelope, stop) -> Prefilled:
        fetched.append(env.job_id)
        _wait(stop)
        return Prefilled(stopped=True)

    outcomes: list[str] = []
    agent.prefetcher = Prefetcher(fill, outcome=outcomes.append)
    env = _envelope("held")
    agent.slots.acquire("busy@1", request_for(env))  # the GPU is taken: the job waits
    agent.accept(Message("m1", "r1", env.model_dump_json(), time.time(), 1))
    agent.dispatch()
    _wait(lambda: fetched == ["held"])
    api.gone.add("held")
    agent._keep_held(agent._held[("held", 1)])
    _wait(lambda: outcomes == ["stopped"])
    assert ("held", 1) not in agent._held and "delete" in sqs.calls
    agent.prefetcher.close()
    off = AgentSettings(**{**s.model_dump(), "prefetch_data": False})
    assert (
        Agent(off, clock=SystemClock(), environ={}, sqs=sqs, node_api=api, inventory=discover(cpu_slots=1)).prefetcher
        is None
    )


def test_a_held_job_pinned_to_other_content_prefetches_none_of_the_model(tmp_path):
    """The job's ``model_hash`` (pinned from the model catalog): a model re-published since is not fetched for it
    (its attempt will fail as a user error; the node's disk and network are not spent on weights it will not run)."""
    objects, cache = _published(tmp_path), tmp_path / "cache"
    fill = cache_filler(cache_dir=cache, objects=lambda j, e: objects, model_root=None, model_s3_root=MODELS)
    pinned = _envelope(inputs=()).model_copy(update={"model_hash": "0" * 64})
    with pytest.raises(ModelChanged):
        fill(pinned, lambda: False)
    assert "pub/m1/w.bin" not in objects.downloads
