"""``gpufleet webhooks`` parsing and rendering, and ``gpufleet submit --max-run-seconds/--deadline`` (pure)."""

from __future__ import annotations

import pytest

from gpufleet.cli import webhooks
from gpufleet.cli.main import build_parser, main
from gpufleet.cli.submit import spec_from_args
from gpufleet.errors import ValidationFailed
from gpufleet.spec import JobSpec


def test_submit_takes_max_run_seconds_and_deadline():
    args = build_parser().parse_args(["submit", "a fox", "--max-run-seconds", "900",
                                      "--deadline", "2030-01-01T00:00:00Z"])
    spec = spec_from_args(args)
    assert spec["max_run_seconds"] == 900 and spec["deadline"] == "2030-01-01T00:00:00Z"
    assert JobSpec.model_validate(spec).max_run_seconds == 900


def test_endpoint_commands_parse():
    parser = build_parser()
    args = parser.parse_args(["webhooks", "endpoints", "create", "https://h.example.com/x", "--event",
                                      "started", "--label", "team=v", "--json"])
    assert (args.func, args.url, args.events, args.label, args.json) == (
        webhooks.run_create, "https://h.example.com/x", ["started"], ["team=v"], True)
    for op in ("get", "delete", "enable", "disable"):
        assert parser.parse_args(["webhooks", "endpoints", op, "we_1"]).endpoint_id == "we_1"
    with pytest.raises(SystemExit):
        parser.parse_args(["webhooks", "endpoints", "create", "https://h.example.com/x", "--event", "finished"])


def test_labels_and_rendering():
    assert webhooks.parse_labels(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ValidationFailed):
        webhooks.parse_labels(["nolabel"])
    text = webhooks.render([{"id": "we_1", "enabled": False, "events": ["completed"], "labels": {},
                             "url": "https://h.example.com/x"}])
    assert text.splitlines()[1].split() == ["we_1", "no", "completed", "*", "https://h.example.com/x"]


def test_a_bad_label_is_one_line_and_exit_1(capsys, monkeypatch):
    monkeypatch.setattr(webhooks, "make_client", lambda args: pytest.fail("no request for a bad label"))
    assert main(["webhooks", "endpoints", "create", "https://h.example.com/x", "--label", "oops"]) == 1
    assert capsys.readouterr().err.strip() == "gpufleet: error: --label expects KEY=VALUE, got 'oops'"
