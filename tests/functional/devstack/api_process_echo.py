"""A proxy handler for the API process tests (``ApiSpec.factory``): it answers with the caller's identity, its pid and when it handled the request,
and ``/slow?s=N`` first sleeps N seconds (a request the parent sees open)."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def build(spec: Any):
    def handle(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        t0 = time.time()
        if event["path"] == "/slow":
            time.sleep(float((event.get("queryStringParameters") or {}).get("s", "1")))
        identity = event["requestContext"]["identity"]
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"},
                "body": json.dumps({"user_arn": identity["userArn"], "path": event["path"], "pid": os.getpid(),
                                    "handled": [t0, time.time()]})}

    return handle
