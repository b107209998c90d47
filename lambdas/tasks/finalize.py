"""Step Functions task `FinalizeLambda`: a short clip's finalize stage in a warm container-image Lambda, over
:func:`gpufleet.runtime.warm_finalize.run` (moderation, watermark, H.264, C2PA, the fenced result on the job item).

The container keeps its settings and clients (:func:`clients`, :func:`settings`) and, through the stage's own
caches, the imported libraries and the moderation models, between invocations. Its role reads the job's generated
output and writes the video, manifest, result and log pages under ``jobs/``, moves a blocked output to
``quarantine/``, makes the stage's fenced job-item writes, and reads the C2PA signing secret (infra/orchestration.py:
the finalize Batch job role's grants, no more).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.warm_finalize import Clients
from gpufleet.runtime.warm_finalize import run as run_finalize
from gpufleet.store.clients import client


@lru_cache(maxsize=1)
def clients() -> Clients:
    return Clients(s3=client("s3"), dynamodb=client("dynamodb"), secretsmanager=client("secretsmanager"))


@lru_cache(maxsize=1)
def settings() -> RuntimeSettings:
    return RuntimeSettings.load()


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return run_finalize(event, clients(), settings())
