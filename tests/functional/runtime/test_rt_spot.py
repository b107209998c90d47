"""Spot interruption: the loopback metadata service (gpufleet.local.imds, IMDSv2) triggers the preemption path."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.local.imds import LocalImds
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.spot import ImdsClient, SpotWatcher, check_once


def test_watcher_uses_a_session_token_and_fires_once_on_notice():
    with LocalImds() as imds:
        client = ImdsClient(imds.endpoint)
        assert check_once(client) is None
        imds.interrupt("terminate")
        assert check_once(client) == "terminate"
        assert len(imds.tokens) == 1 and imds.unauthorised == 0 and imds.notices_served == 1
        fired = threading.Event()
        seen = []
        watcher = SpotWatcher(lambda a: (seen.append(a), fired.set()), endpoint=imds.endpoint, interval_s=0.05)
        watcher.start()
        assert fired.wait(5)
        watcher.stop()
        assert seen == ["terminate"]


def test_local_imds_requires_a_session_token():
    with LocalImds() as imds:
        with pytest.raises(urllib.error.HTTPError) as no_ttl:
            urllib.request.urlopen(urllib.request.Request(imds.endpoint + "/latest/api/token", method="PUT"), timeout=5)
        assert no_ttl.value.code == 400
        imds.interrupt()
        forged = urllib.request.Request(imds.endpoint + "/latest/meta-data/spot/instance-action",
                                        headers={"X-aws-ec2-metadata-token": "forged"})
        with pytest.raises(urllib.error.HTTPError) as unauthorised:
            urllib.request.urlopen(forged, timeout=5)
        assert unauthorised.value.code == 401 and imds.unauthorised == 1 and imds.notices_served == 0
        imds.clear()
        assert check_once(ImdsClient(imds.endpoint)) is None


def test_unreachable_metadata_service_turns_polling_off():
    watcher = SpotWatcher(lambda a: None, endpoint="http://127.0.0.1:9", interval_s=0.01, max_failures=2)
    watcher.start()
    watcher._thread.join(10)
    assert not watcher._thread.is_alive() and watcher.notice is None


def test_a_service_that_answered_once_is_polled_through_failures_until_its_notice():
    """On a loaded host the metadata service may time out several polls in a row; a watcher that has been answered
    keeps polling (giving up would miss the notice): here it fails five polls, then the notice is served."""
    with LocalImds() as imds:
        watcher = SpotWatcher(lambda a: None, endpoint=imds.endpoint, interval_s=0.01, max_failures=2)
        real = watcher.client.instance_action
        calls = {"n": 0}

        def flaky():
            calls["n"] += 1
            if 2 <= calls["n"] <= 6:  # answered once, then five timeouts (more than max_failures)
                raise TimeoutError("timed out")
            if calls["n"] == 7:
                imds.interrupt("terminate")
            return real()

        watcher.client.instance_action = flaky
        watcher.start()
        watcher._thread.join(10)
        assert watcher.notice == "terminate" and calls["n"] >= 7 and imds.notices_served == 1


def test_spot_notice_checkpoints_and_exits_preempted(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=200)
    aws.put_job("job_spot", 1, spec)
    with LocalImds() as imds:
        settings = RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(tiny_cache), imds_endpoint=imds.endpoint,
                                   spot_poll_s=0.05, checkpoint_every_steps=0, progress_interval_s=0, log_flush_s=0,
                                   tiny_generate_side=32, torch_threads=1)

        def arm():  # the notice appears once generation is under way
            rt.wait_for(lambda: (aws.job("job_spot").get("progress") or {}).get("step", 0) >= 1, timeout=120,
                        interval=0.02)
            imds.interrupt("terminate")

        armer = threading.Thread(target=arm, daemon=True)
        armer.start()
        out = io.StringIO()
        code = main(["--envelope-json", json.dumps(aws.envelope("job_spot", 1, spec))], settings=settings,
                    s3=aws.s3, dynamodb=aws.ddb, stdout=out, install_signals=False)
        armer.join(5)
    assert code == ExitCode.PREEMPTED
    result = json.loads(out.getvalue().splitlines()[-1])
    assert result["exit_code"] == "PREEMPTED"
    pointer = aws.job("job_spot")["checkpoint"]
    assert 0 < pointer["step"] < 200 and pointer == result["checkpoint"]
    assert imds.tokens and imds.unauthorised == 0 and imds.notices_served >= 1
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_spot/attempt-0001/"))
    assert b"spot interruption notice: terminate" in logs


def test_entrypoint_rejects_a_malformed_envelope_as_a_user_error():
    proc = subprocess.run([sys.executable, "-m", "gpufleet.runtime", "--envelope-json", '{"job_id": 1}'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.USER_ERROR
    assert json.loads(proc.stdout.splitlines()[-1])["exit_code"] == "USER_ERROR"
