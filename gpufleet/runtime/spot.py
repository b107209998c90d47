"""Spot interruption notices from the EC2 instance metadata service (IMDSv2).

Contract: :class:`SpotWatcher` polls ``<endpoint>/latest/meta-data/spot/instance-action``
every ``interval_s`` with an IMDSv2 session token (``PUT /latest/api/token``,
header ``X-aws-ec2-metadata-token-ttl-seconds``; sent back as
``X-aws-ec2-metadata-token``; refreshed before it expires or after a 401).
404 means no notice. A 200 with ``{"action": "terminate"|"stop"|"hibernate",
"time": ...}`` calls ``on_notice(action)`` once and stops polling. When the
service has never answered and ``max_failures`` polls in a row fail (not on EC2),
polling stops quietly. Once it has answered, a failed poll (a timeout on a loaded
host, a restarting metadata service) is only retried at the next interval: giving
up then would miss the two-minute notice and lose the work since the last
checkpoint. :func:`check_once` is the single poll, for tests and tools.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger("gpufleet.runtime.spot")

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 21600


class ImdsClient:
    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None
        self._token_expiry = 0.0

    def token(self) -> str:
        if self._token and time.monotonic() < self._token_expiry - 60:
            return self._token
        req = urllib.request.Request(f"{self.endpoint}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            self._token = resp.read().decode()
        self._token_expiry = time.monotonic() + TOKEN_TTL_S
        return self._token

    def instance_action(self) -> dict | None:
        """The pending spot instance action, or None (404)."""
        for attempt in range(2):
            req = urllib.request.Request(f"{self.endpoint}/latest/meta-data/spot/instance-action",
                                         headers={"X-aws-ec2-metadata-token": self.token()})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read().decode() or "{}")
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                if err.code == 401 and attempt == 0:
                    self._token = None  # expired token: fetch a new one and retry once
                    continue
                raise
        return None


def check_once(client: ImdsClient) -> str | None:
    """One poll: the notice's action, or None."""
    notice = client.instance_action()
    if notice is None:
        return None
    return str(notice.get("action", "terminate"))


class SpotWatcher:
    def __init__(self, on_notice: Callable[[str], None], endpoint: str = DEFAULT_ENDPOINT,
                 interval_s: float = 5.0, max_failures: int = 3) -> None:
        self.client = ImdsClient(endpoint)
        self.on_notice = on_notice
        self.interval_s = interval_s
        self.max_failures = max_failures
        self.notice: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-watcher", daemon=True)

    def _run(self) -> None:
        failures = 0
        reached = False  # the service has answered once: this host has one, failures from now on are transient
        while not self._stop.is_set():
            try:
                action = check_once(self.client)
                failures, reached = 0, True
            except (OSError, urllib.error.URLError, ValueError) as err:
                failures += 1
                if not reached and failures >= self.max_failures:
                    log.info("instance metadata service unreachable (%s); spot polling off", err)
                    return
                if reached and failures == self.max_failures:
                    log.warning("instance metadata service not answering (%s); still polling", err)
                action = None
            if action:
                self.notice = action
                log.warning("spot interruption notice: %s", action)
                self.on_notice(action)
                return
            self._stop.wait(self.interval_s)

    def start(self) -> SpotWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
