"""A cloud supervisor's token exchange as the runtime calls it (gpufleet.store.nodeapi): unsigned, mapped, renewed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from gpufleet import errors
from gpufleet.store.nodeapi import exchange_supervisor_token, supervisor_client


@dataclass
class Answer:
    status: int
    data: bytes


class Http:
    """A urllib3 PoolManager stand-in: records requests, answers from a list."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, str, dict, dict]] = []

    def request(self, method, url, body=None, headers=None, **_kw):
        self.requests.append((method, url, json.loads(body) if body else {}, dict(headers or {})))
        return self.answers.pop(0)


def session(key: str, ttl: float = 3600) -> Answer:
    return Answer(
        200,
        json.dumps(
            {
                "access_key_id": key,
                "secret_access_key": "s",
                "session_token": "t",
                "expiration": time.time() + ttl,
                "job_id": "j1",
                "epoch": 3,
            }
        ).encode(),
    )


def problem(status: int, slug: str) -> Answer:
    return Answer(
        status,
        json.dumps(
            {"type": f"https://gpufleet/problems/{slug}", "title": slug, "status": status, "detail": "no"}
        ).encode(),
    )


def test_exchange_posts_the_token_unsigned_and_returns_the_session():
    http = Http(session("AKIA1"))
    got = exchange_supervisor_token("https://api.example/prod/", "j1", 3, "tok", http=http)
    assert got["access_key_id"] == "AKIA1"
    method, url, body, headers = http.requests[0]
    assert (method, url, body) == (
        "POST",
        "https://api.example/prod/v1/node/cloud/credentials",
        {"job_id": "j1", "epoch": 3, "token": "tok"},
    )
    assert "Authorization" not in headers  # it has no AWS identity to sign with: the token is the credential


@pytest.mark.parametrize(
    ("answer", "error"),
    [(problem(403, "not-allowed"), errors.NotAllowed), (problem(409, "stale-epoch"), errors.StaleEpoch)],
)
def test_a_refusal_is_raised_once_never_retried(answer, error):
    http = Http(answer, session("unused"))
    with pytest.raises(error):
        exchange_supervisor_token("https://api.example", "j1", 3, "tok", http=http)
    assert len(http.requests) == 1


def test_a_5xx_is_retried():
    http = Http(Answer(503, b"{}"), session("AKIA2"))
    assert exchange_supervisor_token("https://api.example", "j1", 3, "tok", http=http)["access_key_id"] == "AKIA2"


def test_the_client_signs_with_the_session_and_renews_it_through_its_attempt_route():
    http = Http(session("AKIA-FIRST", ttl=1), session("AKIA-RENEWED"), Answer(200, b'{"job_id": "j1"}'))
    api, creds = supervisor_client("https://api.example", "us-east-1", "j1", 3, "tok", http=http)
    assert api.attempt("j1", 3, "view") == {"job_id": "j1"}
    renew, view = http.requests[1], http.requests[2]
    assert renew[1].endswith("/v1/node/jobs/j1/attempts/3/credentials")  # expiring in 1 s: renewed first
    assert "AKIA-FIRST" in renew[3]["Authorization"]
    assert "AKIA-RENEWED" in view[3]["Authorization"]
    assert creds.get_frozen_credentials().access_key == "AKIA-RENEWED"
