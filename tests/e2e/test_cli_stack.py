"""The CLI driving the real embedded stack (``gpufleet dev`` in its own process).

The stack is the e2e session's (tests/e2e/conftest.py: started once, stopped with SIGINT at the
end, which must exit 0 cleanly). The jobs run through the SigV4 gateway, the API handler, the deployed state
machine on moto, the scheduler pass, the on-prem agent and the runtime — nothing is faked.
"""

from __future__ import annotations

import json

import pytest

from gpufleet.cli.main import main

pytestmark = [pytest.mark.xdist_group("e2e-stack"), pytest.mark.slow]

JOB_TIMEOUT_S = 180
PROMPT = "a small boat on a blue sea at night"


@pytest.fixture
def stack(devstack):
    """The session's stack (tests/e2e/conftest.py); the CLI reads its profile through GPUFLEET_PROFILE."""
    return devstack


def cli_json(argv, capsys):
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_submit_wait_then_output_verifies(stack, capsys, tmp_path):
    code = main(["submit", PROMPT, "--frames", "5", "--steps", "4", "--wait", "--timeout", str(JOB_TIMEOUT_S)])
    captured = capsys.readouterr()
    job_id, status = captured.out.strip().splitlines()[-1].split()
    assert (code, status) == (0, "SUCCEEDED"), captured.err[-3000:] + stack["log"].read_text()[-3000:]
    assert "step 4/4" in captured.err or "FINALIZING" in captured.err  # the progress line was drawn

    assert main(["output", job_id, "-o", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "C2PA:      Trusted  ok" in text and "watermark:" in text
    from gpufleet.provenance.video import decode_mp4

    assert decode_mp4(tmp_path / f"{job_id}.mp4").shape[0] == 5
    from gpufleet.provenance import verify

    # the stack's local RFC 3161 authority time-stamped the signature (no time without one)
    assert verify(tmp_path / f"{job_id}.mp4").manifest["signature_info"].get("time")

    # A stream-copy remux strips the C2PA manifest; the platform's watermark lookup still finds the job,
    # and the kept original (downloaded by `verify -o`) verifies as Trusted.
    from gpufleet.provenance.robustness import remux

    stripped = tmp_path / "stripped.mp4"
    stripped.write_bytes(remux((tmp_path / f"{job_id}.mp4").read_bytes()))
    code, report = cli_json(["verify", str(stripped), "-o", str(tmp_path / "recovered")], capsys)
    assert code == 0 and report["c2pa_state"] == "None", report
    assert [m["job_id"] for m in report["lookup"]["matches"]] == [job_id]
    assert report["originals"] == {job_id: "Trusted"}

    code, events = cli_json(["events", job_id], capsys)
    assert code == 0 and events and all("ts" in e for e in events)
    code, listed = cli_json(["ls", "--status", "SUCCEEDED"], capsys)
    assert code == 0 and job_id in [j["job_id"] for j in listed]
    code, job = cli_json(["status", job_id], capsys)
    assert job["status"] == "SUCCEEDED" and job["output"]["video_key"]
    assert main(["logs", job_id]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines  # the runtime's log lines reached the API
    assert main(["logs", job_id, "-f", "--timeout", "30"]) == 0  # the job is over: follow drains and ends
    assert capsys.readouterr().out.strip().splitlines() == lines
    assert main(["cancel", job_id]) == 1  # already SUCCEEDED: refused, one line, exit 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpufleet: error: ") and "SUCCEEDED" in err[0]


def test_cancel_a_queued_job(stack, capsys):
    spec = {"workload": {"kind": "video.generate", "prompt": PROMPT, "frames": 5, "steps": 50}}
    from gpufleet.sdk import Client

    client = Client()
    job = client.submit(spec)
    assert main(["cancel", job.job_id]) == 0
    assert "cancellation requested" in capsys.readouterr().out
    final = client.wait(job.job_id, timeout=60, poll_s=0.5)
    assert final.status.value == "CANCELLED"
    assert (final.billing or {}).get("charged") in (None, False)  # never ran: not charged
    assert main(["cancel", job.job_id]) == 0  # idempotent: the same outcome again
    assert "(status CANCELLED)" in capsys.readouterr().out


def test_bad_spec_file_is_one_line_and_nothing_is_submitted(stack, capsys, tmp_path):
    code, before = cli_json(["ls", "--all"], capsys)
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps({"workload": {"kind": "video.generate", "prompt": "x", "width": 100}}))
    assert main(["submit", "-f", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multiples of 16" in err[0]
    code, after = cli_json(["ls", "--all"], capsys)
    assert len(after) == len(before)


def test_read_commands_emit_json(stack, capsys):
    for argv in (["quota"], ["pools"], ["ls", "--limit", "3"]):
        code, doc = cli_json(argv, capsys)
        assert code == 0, argv
    assert cli_json(["pools"], capsys)[1]  # the dev stack has at least the on-prem pool
