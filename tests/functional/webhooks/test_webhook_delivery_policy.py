"""The webhook URL policy at delivery time: real loopback receivers (HTTP and HTTPS), moto DynamoDB/SQS.

A refused target is a permanent failure (logged dead-lettered with a reason, no retry) and gets no
connection at all: the receivers count accepted TCP connections, not only requests.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.clock import FakeClock, SystemClock
from gpufleet.jobrecord import JobRecord
from gpufleet.tables import TableNames
from gpufleet.webhooks import delivery, urlpolicy

T = TableNames()


def _serve(status: int = 200, tls: ssl.SSLContext | None = None, location: str = "/elsewhere") -> dict:
    state: dict = {"connections": 0, "requests": [], "sni": []}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            state["requests"].append((self.path, self.headers["host"]))
            self.send_response(state.get("status", status))
            if 300 <= state.get("status", status) < 400:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            return

    class S(ThreadingHTTPServer):
        def verify_request(self, request, client_address):  # every accepted TCP connection
            state["connections"] += 1
            return True

    srv = S(("127.0.0.1", 0), H)
    if tls is not None:
        tls.sni_callback = lambda sock, name, ctx: state["sni"].append(name)
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["port"] = srv.server_address[1]
    state["srv"] = srv
    return state


@pytest.fixture
def receiver():
    state = _serve()
    yield state
    state["srv"].shutdown()
    state["srv"].server_close()


def _queued(aws, new_job, url):
    # Visibility 0: a received message is visible again at once unless the sender sets a backoff.
    q = aws["sqs"].create_queue(QueueName=f"hooks-{uuid.uuid4().hex[:8]}", Attributes={"VisibilityTimeout": "0"})
    q = q["QueueUrl"]
    job = new_job(webhook=url)
    job["status"] = "SUCCEEDED"
    delivery.enqueue(aws["sqs"], q, JobRecord.from_item(job), "completed", clock=FakeClock())
    (msg,) = aws["sqs"].receive_message(QueueUrl=q, AttributeNames=["All"])["Messages"]
    return q, job, msg


def _deliver(aws, q, msg, **kw):
    return delivery.deliver_message(msg["Body"], 1, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control, keys=aws["keys"],
                                 clock=SystemClock(),
                                    sqs=aws["sqs"], queue_url=q, receipt_handle=msg["ReceiptHandle"], timeout_s=5,
                                    **kw)


def _assert_refused(aws, q, job, result, receiver, reason):
    assert not result.delivered and result.status_code == 0 and result.next_delay_s is None
    assert reason in result.refused
    assert receiver["connections"] == 0 and receiver["requests"] == []  # not even a TCP connection
    (log,) = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert log["dead_lettered"] is True and log.get("next_retry_at") is None and reason in log["reason"]
    # No backoff was set: the message is visible again at once (the sender Lambda drops it, see below).
    assert aws["sqs"].receive_message(QueueUrl=q).get("Messages")


def test_loopback_receiver_refused_by_default_and_accepted_when_allowed(aws, new_job, receiver):
    url = f"http://127.0.0.1:{receiver['port']}/h"
    q, job, msg = _queued(aws, new_job, url)
    _assert_refused(aws, q, job, _deliver(aws, q, msg), receiver, "scheme must be https")

    ok = _deliver(aws, q, msg, allow_private=True)
    assert ok.delivered and ok.status_code == 200 and ok.refused is None
    assert receiver["requests"] == [("/h", f"127.0.0.1:{receiver['port']}")]


def test_https_loopback_literal_refused_as_loopback(aws, new_job, receiver):
    q, job, msg = _queued(aws, new_job, f"https://127.0.0.1:{receiver['port']}/h")
    _assert_refused(aws, q, job, _deliver(aws, q, msg), receiver, "127.0.0.1: loopback address refused")


def test_hostname_resolving_to_loopback_is_refused_after_resolution(aws, new_job, receiver):
    q, job, msg = _queued(aws, new_job, f"https://localhost:{receiver['port']}/h")  # real getaddrinfo
    _assert_refused(aws, q, job, _deliver(aws, q, msg), receiver, "localhost resolves to")


def test_one_private_address_among_public_ones_refuses_the_host(aws, new_job, receiver):
    q, job, msg = _queued(aws, new_job, f"https://hooks.example.com:{receiver['port']}/h")
    result = _deliver(aws, q, msg, resolver=lambda host, port: ["93.184.216.34", "169.254.169.254"])
    _assert_refused(aws, q, job, result, receiver, "hooks.example.com resolves to 169.254.169.254: link-local")


def test_connection_goes_to_the_checked_address_with_the_original_host_header(aws, new_job, receiver):
    """Pinning: ``hooks.test`` has no DNS record; the sender connects to the address its resolver
    gave (and it checked) and never asks DNS again, while Host stays the hostname."""
    resolved = []

    def resolver(host, port):
        resolved.append((host, port))
        return ["127.0.0.1"]

    q, _, msg = _queued(aws, new_job, f"http://hooks.test:{receiver['port']}/h?x=1")
    r = _deliver(aws, q, msg, allow_private=True, resolver=resolver)
    assert r.delivered and resolved == [("hooks.test", receiver["port"])]
    assert receiver["requests"] == [("/h?x=1", f"hooks.test:{receiver['port']}")]


def test_unresolvable_host_is_an_ordinary_retried_failure(aws, new_job, receiver):
    q, job, msg = _queued(aws, new_job, "https://no-such-host.invalid/h")
    r = _deliver(aws, q, msg)
    assert not r.delivered and r.refused is None and r.next_delay_s is not None
    assert aws["sqs"].receive_message(QueueUrl=q).get("Messages") is None  # hidden for the backoff


def test_redirect_is_a_failed_delivery_not_followed(aws, new_job, receiver):
    receiver["status"] = 302
    q, job, msg = _queued(aws, new_job, f"http://127.0.0.1:{receiver['port']}/h")
    r = _deliver(aws, q, msg, allow_private=True)
    assert not r.delivered and r.status_code == 302 and r.next_delay_s is not None
    assert [p for p, _ in receiver["requests"]] == ["/h"]  # /elsewhere never asked for


def test_sender_handler_drops_refused_messages_and_reads_the_setting(aws, new_job, receiver, monkeypatch):
    from lambdas.tasks import webhook_sender

    q, job, msg = _queued(aws, new_job, f"http://127.0.0.1:{receiver['port']}/h")
    monkeypatch.setenv("GPUFLEET_WEBHOOK_QUEUE_URL", q)
    monkeypatch.setenv("GPUFLEET_WEBHOOK_KEY_ID", aws["key_id"])
    monkeypatch.setattr(webhook_sender, "_clients", lambda: (aws["dynamodb"], aws["sqs"], aws["kms"]))
    monkeypatch.setattr(webhook_sender, "_settings", lambda: webhook_sender.SenderSettings.load())  # a new container
    event = {"Records": [{"messageId": msg["MessageId"], "body": msg["Body"], "receiptHandle": msg["ReceiptHandle"],
                          "attributes": {"ApproximateReceiveCount": "1"}}]}
    monkeypatch.delenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", raising=False)
    assert webhook_sender.handler(event) == {"batchItemFailures": []}  # permanent: not handed back to SQS
    assert receiver["connections"] == 0
    monkeypatch.setenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")
    assert webhook_sender.handler(event) == {"batchItemFailures": []}
    assert len(receiver["requests"]) == 1
    logs = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert [(e["delivered"], e["dead_lettered"]) for e in logs] == [(False, True), (True, False)]


# ------------------------------------------------------------------ HTTPS: SNI and certificate name


def _self_signed(name: str) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


@pytest.fixture
def tls_receiver(tmp_path):
    cert, key = _self_signed("hooks.test")
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    state = _serve(tls=server_ctx)
    client_ctx = ssl.create_default_context(cadata=cert.decode())
    state["client_ctx"] = client_ctx
    yield state
    state["srv"].shutdown()
    state["srv"].server_close()


def test_https_pinned_connection_uses_the_hostname_for_sni_and_certificate(tls_receiver):
    port, ctx = tls_receiver["port"], tls_receiver["client_ctx"]
    loopback = [ipaddress.ip_address("127.0.0.1")]
    target = urlpolicy.check_url(f"https://hooks.test:{port}/h", allow_private=True)
    assert delivery.pinned_post(target, loopback, {"content-type": "application/json"}, b"{}", 5, context=ctx) == 200
    assert tls_receiver["sni"] == ["hooks.test"]
    assert tls_receiver["requests"] == [("/h", f"hooks.test:{port}")]
    # The certificate is checked against the URL's hostname, not the pinned address.
    other = urlpolicy.check_url(f"https://other.test:{port}/h", allow_private=True)
    assert delivery.pinned_post(other, loopback, {}, b"{}", 5, context=ctx) == 0
    assert len(tls_receiver["requests"]) == 1
