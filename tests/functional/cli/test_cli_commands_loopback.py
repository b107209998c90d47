"""The CLI commands against a scripted loopback API: output formats, --json, exit codes, one-line errors."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet.cli.main import main
from gpufleet.profile import Profile, write_profile

SPEC = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}


def job(job_id="job_01", status="QUEUED", **kw):
    return {"job_id": job_id, "status": status, "spec": SPEC, "created_at": "2026-11-30T05:00:00.000Z", **kw}


@pytest.fixture
def profile_file(loopback, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    path = write_profile(
        Profile(endpoint=loopback.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY),
        tmp_path / "profile.json",
    )
    monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
    return path


def test_submit_prompt_prints_the_job_id(loopback, profile_file, capsys):
    loopback.script = [(202, {}, job("job_new"))]
    assert main(["submit", "a red fox running in snow", "--steps", "4", "--label", "team=demo"]) == 0
    assert capsys.readouterr().out.strip() == "job_new  QUEUED"
    sent = loopback.seen[0].json()
    assert sent["workload"]["steps"] == 4 and sent["labels"] == {"team": "demo"}
    assert loopback.seen[0].signature_ok


def test_submit_json_parses(loopback, profile_file, capsys):
    loopback.script = [(202, {}, job("job_new"))]
    assert main(["submit", "a fox", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "job_new"


@pytest.mark.parametrize(
    ("content", "name", "needle"),
    [
        (
            '{"workload": {"kind": "video.generate", "prompt": "x", "frames": 8}}',
            "bad.json",
            "frames must be of the form 4k+1",
        ),
        ('{"workload": ', "broken.json", "is not valid JSON"),
        ("[1, 2]", "list.json", "must hold an object"),
        ('{"workload": {"kind": "video.generate", "prompt": "x"}, "colour": "red"}', "extra.json", "colour"),
        ("workload = 3", "bad.toml", "workload"),
    ],
)
def test_a_bad_spec_file_gives_one_line_and_exit_1(loopback, profile_file, tmp_path, capsys, content, name, needle):
    spec = tmp_path / name
    spec.write_text(content)
    assert main(["submit", "-f", str(spec)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufleet: error: ") and needle in lines[0]
    assert loopback.seen == []  # never sent


def test_missing_spec_file(profile_file, capsys):
    assert main(["submit", "-f", "/nonexistent/job.json"]) == 1
    assert capsys.readouterr().err.strip() == "gpufleet: error: spec file /nonexistent/job.json does not exist"


def test_submit_wait_draws_progress_and_exits_by_outcome(loopback, profile_file, capsys, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    states = iter(
        [
            (202, {}, job("job_w")),
            (200, {}, job("job_w", "RUNNING", progress={"step": 5, "total": 10})),
            (200, {}, job("job_w", "FAILED")),
        ]
    )
    loopback.handler = lambda seen: next(states)
    assert main(["submit", "a fox", "--wait"]) == 3
    captured = capsys.readouterr()
    assert "[############------------] step 5/10" in captured.err
    assert captured.out.strip().splitlines()[-1] == "job_w FAILED"


def test_ls_table_and_json(loopback, profile_file, capsys):
    def handler(seen):
        q = parse_qs(urlsplit(seen.path).query)
        if q.get("cursor") == ["c2"]:
            return 200, {}, {"jobs": [job("job_1", "SUCCEEDED")], "next_cursor": None}
        return (
            200,
            {},
            {"jobs": [job("job_3", "RUNNING", progress={"step": 2, "total": 10}), job("job_2")], "next_cursor": "c2"},
        )

    loopback.handler = handler
    assert main(["ls", "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["JOB", "STATUS", "CREATED", "STEP", "WORKLOAD"]
    assert [line.split()[0] for line in out[1:]] == ["job_3", "job_2", "job_1"]
    assert "2/10" in out[1]
    assert main(["ls", "--json", "--limit", "2"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == ["job_3", "job_2"]


def test_status_events_cancel(loopback, profile_file, capsys):
    routes = {
        ("GET", "/v1/jobs/job_01"): (
            200,
            {},
            job(status="SUCCEEDED", billing={"charged": True, "gpu_seconds": 1.5, "amount_usd": 0.001}),
        ),
        ("GET", "/v1/jobs/job_01/events"): (200, {}, {"events": [{"ts": "t1", "type": "status", "status": "QUEUED"}]}),
        ("DELETE", "/v1/jobs/job_01"): (
            409,
            {},
            {
                "type": "https://gpufleet.dev/problems/invalid-transition",
                "status": 409,
                "detail": "job job_01 is already SUCCEEDED",
            },
        ),
    }
    loopback.handler = lambda seen: routes[(seen.method, seen.path)]
    assert main(["status", "job_01"]) == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED" in out and "gpu_seconds=1.5" in out
    assert main(["status", "job_01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "SUCCEEDED"
    assert main(["events", "job_01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "QUEUED"
    assert main(["cancel", "job_01"]) == 1
    assert capsys.readouterr().err.strip() == "gpufleet: error: job job_01 is already SUCCEEDED"


def test_unreachable_endpoint_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("time.sleep", lambda s: None)
    path = write_profile(
        Profile(endpoint="http://127.0.0.1:9", access_key_id="a", secret_access_key="b"), tmp_path / "p.json"
    )
    assert main(["status", "job_01", "--profile", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpufleet: error: cannot reach http://127.0.0.1:9")


def test_no_profile_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    for var in ("GPUFLEET_PROFILE", "GPUFLEET_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["ls"]) == 2
    assert "gpufleet dev" in capsys.readouterr().err
