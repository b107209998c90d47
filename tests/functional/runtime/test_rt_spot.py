"""Spot interruption: a fake instance metadata service (IMDSv2) on loopback triggers the preemption path."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.spot import ImdsClient, SpotWatcher, check_once


class FakeImds:
    """Loopback IMDSv2: PUT /latest/api/token, GET /latest/meta-data/spot/instance-action (404 until armed)."""

    def __init__(self) -> None:
        self.action: dict | None = None
        self.tokens_issued = 0
        self.unauthorised = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def do_PUT(self):
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self.send_response(400)
                    self.end_headers()
                    return
                fake.tokens_issued += 1
                body = f"token-{fake.tokens_issued}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if not (self.headers.get("X-aws-ec2-metadata-token") or "").startswith("token-"):
                    fake.unauthorised += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                if self.path != "/latest/meta-data/spot/instance-action" or fake.action is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(fake.action).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_watcher_uses_a_session_token_and_fires_once_on_notice():
    with FakeImds() as imds:
        client = ImdsClient(imds.endpoint)
        assert check_once(client) is None
        imds.action = {"action": "terminate", "time": "2026-11-30T06:00:00Z"}
        assert check_once(client) == "terminate"
        assert imds.tokens_issued == 1 and imds.unauthorised == 0
        fired = threading.Event()
        seen = []
        watcher = SpotWatcher(lambda a: (seen.append(a), fired.set()), endpoint=imds.endpoint, interval_s=0.05)
        watcher.start()
        assert fired.wait(5)
        watcher.stop()
        assert seen == ["terminate"]


def test_unreachable_metadata_service_turns_polling_off():
    watcher = SpotWatcher(lambda a: None, endpoint="http://127.0.0.1:9", interval_s=0.01, max_failures=2)
    watcher.start()
    watcher._thread.join(10)
    assert not watcher._thread.is_alive() and watcher.notice is None


def test_spot_notice_checkpoints_and_exits_preempted(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=200)
    aws.put_job("job_spot", 1, spec)
    with FakeImds() as imds:
        settings = RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(tiny_cache), imds_endpoint=imds.endpoint,
                                   spot_poll_s=0.05, checkpoint_every_steps=0, progress_interval_s=0, log_flush_s=0,
                                   tiny_generate_side=32, torch_threads=1)

        def arm():  # the notice appears once generation is under way
            rt.wait_for(lambda: (aws.job("job_spot").get("progress") or {}).get("step", 0) >= 1, timeout=120,
                        interval=0.02)
            imds.action = {"action": "terminate", "time": "2026-11-30T06:02:00Z"}

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
    assert imds.tokens_issued >= 1 and imds.unauthorised == 0
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_spot/attempt-0001/"))
    assert b"spot interruption notice: terminate" in logs


def test_entrypoint_rejects_a_malformed_envelope_as_a_user_error():
    proc = subprocess.run([sys.executable, "-m", "gpufleet.runtime", "--envelope-json", '{"job_id": 1}'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.USER_ERROR
    assert json.loads(proc.stdout.splitlines()[-1])["exit_code"] == "USER_ERROR"
