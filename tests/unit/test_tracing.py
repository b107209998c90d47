"""One trace per job (gpufleet.tracing): the traceparent the API starts or takes from the caller, stored on
the job, carried in the envelope (pointer form too), started into the execution as X-Ray ``traceHeader``
and put on every log line of the runtime and the on-prem agent. Pure or on in-memory fakes."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace

from gpufleet import outbox, tracing
from gpufleet.api import arrays, recovery, service
from gpufleet.api.models import JobArrayRequest
from gpufleet.api.settings import load
from gpufleet.cli.status import describe
from gpufleet.clock import FakeClock
from gpufleet.envelope import Envelope
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle.settings import LifecycleSettings
from gpufleet.lifecycle.steps import envelope_for
from gpufleet.placement import Placement
from gpufleet.runtime.logs import S3LogHandler
from gpufleet.runtime.main import console_formatter
from gpufleet.sdk_models import Job
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.principals import Principal
from onprem_agent.logs import configure, job_logger

NOW = 1_780_000_000.0
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ALICE = Principal(arn="arn:aws:iam::1:user/alice", tenant="t1", team="vision", user="alice")


def _rand(n: int) -> str:
    return "ab" * n


def test_a_new_trace_id_is_an_xray_trace_id_and_a_callers_trace_is_kept():
    tp = tracing.for_request(None, NOW, _rand)
    assert tp == f"00-{int(NOW):08x}{'ab' * 12}-{'ab' * 8}-01" and tracing.valid(tp)
    assert tracing.xray_header(tp) == f"Root=1-{int(NOW):08x}-{'ab' * 12};Parent={'ab' * 8};Sampled=1"
    kept = tracing.for_request(CALLER, NOW, _rand)
    assert kept == "00-4bf92f3577b34da6a3ce929d0e0e4736-abababababababab-01"  # same trace, the API's span
    assert tracing.trace_id(kept) == "4bf92f3577b34da6a3ce929d0e0e4736"
    unsampled = tracing.for_request(CALLER[:-2] + "00", NOW, _rand)
    assert tracing.xray_header(unsampled).endswith(";Sampled=0")


def test_an_invalid_traceparent_is_refused_and_starts_a_new_trace():
    for bad in ("", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
                "ff" + CALLER[2:], CALLER.upper(), CALLER + "-x", "00-xyz", None):
        assert not tracing.valid(bad) and tracing.trace_id(bad) is None and tracing.xray_header(bad) is None
        new = tracing.for_request(bad, NOW)
        assert tracing.valid(new) and tracing.trace_id(new).startswith(f"{int(NOW):08x}")


def _deps():
    clock = FakeClock(NOW)
    db = MemoryDatabase()
    settings = load(cursor_secret="unit-cursor-secret-0123456789")
    return service.Deps(settings=settings, ddb=None, clock=clock, jobs=MemoryJobStore(db, clock),
                        idempotency=MemoryIdempotencyStore(db, clock))


def _spec() -> JobSpec:
    return JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "a red kite"}})


def test_submit_stores_the_trace_on_the_job_and_answers_it():
    deps = _deps()
    res = service.submit(deps, ALICE, _spec(), "k1", traceparent=CALLER)
    stored = deps.jobs.get(res.job_id, "t1")["traceparent"]
    assert tracing.trace_id(stored) == tracing.trace_id(CALLER) and stored != CALLER
    assert res.headers[tracing.HEADER] == stored
    view = service.get(deps, ALICE, res.job_id)  # GET /v1/jobs/{id} and `gpufleet status` show it
    assert view.traceparent == stored
    assert ("trace", stored) in describe(Job.model_validate(view.model_dump(mode="json")))
    assert service.submit(deps, ALICE, _spec(), "k1").headers[tracing.HEADER] == stored  # a replay: the same trace
    fresh = service.submit(deps, ALICE, _spec(), "k2")  # no header: a new trace
    assert tracing.valid(deps.jobs.get(fresh.job_id, "t1")["traceparent"])
    assert tracing.trace_id(fresh.headers[tracing.HEADER]) != tracing.trace_id(CALLER)
    deps.jobs.transition(res.job_id, [JobStatus.QUEUED], JobStatus.REJECTED)
    retried = recovery.retry(deps, ALICE, res.job_id, "k3", traceparent=CALLER)
    assert tracing.trace_id(deps.jobs.get(retried.job_id, "t1")["traceparent"]) == tracing.trace_id(CALLER)
    arr = arrays.submit_array(deps, ALICE, JobArrayRequest.model_validate(
        {"count": 2, "spec": _spec().model_dump(mode="json", exclude_none=True)}), "k4", traceparent=CALLER)
    for job_id in json.loads(arr.body)["job_ids"]:
        assert tracing.trace_id(deps.jobs.get(job_id, "t1")["traceparent"]) == tracing.trace_id(CALLER)


def _job(**kw) -> JobRecord:
    return JobRecord.from_item({"job_id": "job_1", "tenant": "t", "team": "a", "user": "u", "status": "SCHEDULED",
                                "spec": _spec().model_dump(mode="json", exclude_none=True), "priority": 0,
                                "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", **kw})


def test_the_envelope_carries_the_jobs_trace_in_both_forms():
    deps = SimpleNamespace(settings=LifecycleSettings())
    placement = Placement.model_validate({"epoch": 1, "attempt": 1, "target": "cloud", "pool": "cloud-ondemand"})
    env = envelope_for(deps, _job(traceparent=CALLER), placement, "generate")
    assert env.traceparent == CALLER
    pointer = Envelope.model_validate_json(env.pointer().model_dump_json(exclude_none=True))
    assert pointer.spec is None and pointer.traceparent == CALLER
    assert envelope_for(deps, _job(), placement, "generate").traceparent is None  # an older job
    assert envelope_for(deps, _job(traceparent="garbage"), placement, "generate").traceparent is None


class _Sfn:
    def __init__(self):
        self.calls = []

    def start_execution(self, **kw):
        self.calls.append(kw)
        return {"executionArn": "arn:aws:states:r:1:execution:sm:" + kw["name"]}


def test_the_outbox_starts_the_execution_in_the_jobs_trace():
    image = {"pk": {"S": "JOB#job_1"}, "sk": {"S": "META"}, "job_id": {"S": "job_1"}, "traceparent": {"S": CALLER}}
    records = [{"eventName": "INSERT", "dynamodb": {"SequenceNumber": "1", "NewImage": image}},
               {"eventName": "INSERT", "dynamodb": {"SequenceNumber": "2", "NewImage": {
                   k: v for k, v in image.items() if k != "traceparent"} | {"job_id": {"S": "job_2"},
                                                                             "pk": {"S": "JOB#job_2"}}}}]
    sfn = _Sfn()
    outbox.process(records, sfn, "arn:aws:states:r:1:stateMachine:sm")
    assert sfn.calls[0]["traceHeader"] == tracing.xray_header(CALLER)
    assert "traceHeader" not in sfn.calls[1]  # a job without a trace starts a plain execution


class _Objects:
    def __init__(self):
        self.put = []

    def put_bytes(self, bucket, key, data, content_type=None):
        self.put.append(data)


def test_every_runtime_and_agent_log_line_of_the_job_carries_its_trace_id():
    tid = tracing.trace_id(CALLER)
    objects = _Objects()
    handler = S3LogHandler(objects, "logs", "job_1", 1, interval_s=0, clock=FakeClock(NOW), trace_id=tid)
    console = io.StringIO()
    stream = logging.StreamHandler(console)
    stream.setFormatter(console_formatter(tid))
    log = logging.getLogger("gpufleet.test_tracing")
    log.propagate = False
    log.handlers[:] = [handler, stream]
    log.setLevel(logging.INFO)
    log.info("one")
    log.warning("two %d", 2)
    handler.close()
    handler.flush()
    lines = [json.loads(x) for x in b"".join(objects.put).decode().splitlines()]
    assert [(x["msg"], x["trace_id"]) for x in lines] == [("one", tid), ("two 2", tid)]
    assert console.getvalue().splitlines() == [f"one trace_id={tid}", f"two 2 trace_id={tid}"]
    assert console_formatter(None).format(logging.makeLogRecord({"msg": "x"})) == "x"

    buf = io.StringIO()
    configure("INFO", node="n1", stream=buf)
    job_logger("job_1", 1, tid).info("job started", extra={"pid": 7})
    job_logger("job_2", 1).info("job started")
    first, second = (json.loads(x) for x in buf.getvalue().splitlines())
    assert first["trace_id"] == tid and first["job_id"] == "job_1" and first["pid"] == 7
    assert "trace_id" not in second
