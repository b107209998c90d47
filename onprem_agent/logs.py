"""Structured JSON logs: one object per line with ts, level, logger, msg and any context
(``job_id``, ``epoch``, ``trace_id``, ``node``, ...) passed through ``extra=``."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from gpufleet.clock import iso

_STD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self.static,
        }
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=False)


def configure(level: str = "INFO", node: str | None = None, stream=None) -> None:
    """Route the ``onprem_agent`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter({"node": node} if node else None))
    root = logging.getLogger("onprem_agent")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class _ContextAdapter(logging.LoggerAdapter):
    """Adds the job context to every record, keeping the call's own ``extra`` fields."""

    def process(self, msg, kwargs):
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def job_logger(job_id: str, epoch: int, trace_id: str | None = None) -> logging.LoggerAdapter:
    """The logger of one attempt: every record carries ``job_id``, ``epoch`` and, when the job has a trace
    (:mod:`gpufleet.tracing`), its ``trace_id``."""
    extra: dict[str, Any] = {"job_id": job_id, "epoch": epoch}
    if trace_id:
        extra["trace_id"] = trace_id
    return _ContextAdapter(logging.getLogger("onprem_agent.job"), extra)
