"""The one exception → RFC 9457 problem mapping, and transition writes built from the table (pure)."""

from __future__ import annotations

import json

import pytest
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType
from hypothesis import given
from hypothesis import strategies as st

from gpufleet import errors
from gpufleet.api.problems import PROBLEM_JSON, to_problem, validation_problem
from gpufleet.status import ACTIVE_QUEUE, TRANSITIONS, JobStatus
from gpufleet.store.jobs import transition_update


@pytest.mark.parametrize(
    "exc,status,slug",
    [
        (errors.BadRequest("x"), 400, "bad-request"),
        (errors.Unauthorized("x"), 403, "forbidden"),
        (errors.NotFound("x"), 404, "not-found"),
        (errors.IdempotencyInFlight("x"), 409, "idempotency-in-flight"),
        (errors.InvalidTransition("x", current_status="FAILED"), 409, "invalid-transition"),
        (errors.IdempotencyMismatch("x"), 422, "idempotency-mismatch"),
        (errors.QuotaExceeded("x", retry_after=7, limit="queued_jobs_per_user"), 429, "quota-exceeded"),
        (errors.TooManyRequests("x", retry_after=7, limit="requests_per_second"), 429, "rate-limited"),
        (errors.UnsupportedMediaType("x"), 415, "unsupported-media-type"),
        (RequestUnsupportedContentType("Unsupported content type", errors=[]), 415, "unsupported-media-type"),
        (RuntimeError("secret internals"), 500, "internal"),
    ],
)
def test_mapping(exc, status, slug):
    code, headers, body = to_problem(exc, instance="/v1/jobs")
    doc = json.loads(body)
    assert code == doc["status"] == status and doc["type"].endswith("/" + slug)
    assert headers["Content-Type"] == PROBLEM_JSON and doc["instance"] == "/v1/jobs"
    if status == 429:
        assert headers["Retry-After"] == "7" and doc["limit"] in ("queued_jobs_per_user", "requests_per_second")
    if status == 500:
        assert "secret" not in body
    if slug == "invalid-transition":
        assert doc["current_status"] == "FAILED"


def test_validation_problem_lists_fields():
    p = validation_problem(
        [{"loc": ("body", "workload", "frames"), "msg": "bad"}, {"loc": ("query", "limit"), "msg": "x"}]
    )
    assert p.status == 400 and p.extra["errors"][0] == {"field": "workload.frames", "message": "bad"}
    assert "and 1 more" in p.detail


edges = [(a, b) for a, outs in TRANSITIONS.items() for b in outs]


@given(st.sampled_from(edges))
def test_transition_update_keeps_sparse_indexes_right(edge):
    a, b = edge
    upd = transition_update("jobs", "job_1", [a], b, 1_700_000_000.0)["Update"]
    expr = upd["UpdateExpression"]
    names = upd["ExpressionAttributeNames"]
    removed = {names[n.strip()] for n in expr.split(" REMOVE ")[1].split(",")} if " REMOVE " in expr else set()
    assert ("gsi3pk = :pp" in expr) == (b is JobStatus.PENDING)
    assert ("gsi3pk" in removed) == (b is not JobStatus.PENDING)
    assert ("gsi4pk = active_part" in expr) == (b in ACTIVE_QUEUE)
    assert ("gsi4pk" in removed) == (b not in ACTIVE_QUEUE)
    assert upd["ExpressionAttributeValues"][":f0"] == {"S": a.value}


@given(st.sampled_from(list(JobStatus)), st.sampled_from(list(JobStatus)))
def test_transition_update_refuses_edges_not_in_the_table(a, b):
    if b in TRANSITIONS[a]:
        return
    with pytest.raises(errors.InvalidTransition):
        transition_update("jobs", "job_1", [a], b, 0.0)


def test_every_validation_problem_carries_errors():
    for exc, field in (
        (errors.ValidationFailed("a number in the spec is outside what can be stored"), "body"),
        (errors.ValidationFailed("node_id must match x", field="node_id"), "node_id"),
    ):
        doc = json.loads(to_problem(exc)[2])
        assert doc["status"] == 400 and doc["errors"] == [{"field": field, "message": exc.detail}]
    given_errors = [{"field": "webhook.url", "message": "no"}]
    doc = json.loads(to_problem(errors.ValidationFailed("webhook.url: no", errors=given_errors))[2])
    assert doc["errors"] == given_errors
