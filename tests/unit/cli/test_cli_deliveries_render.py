"""Pure rendering of ``gpufleet deliveries`` rows and the SDK's Delivery model (no sockets)."""

from __future__ import annotations

from gpufleet.cli.deliveries import deliveries_table, delivery_row
from gpufleet.cli.main import build_parser
from gpufleet.sdk_models import Delivery


def test_rows_show_no_response_and_dead_letter():
    final = Delivery(at="t8", event_type="job.completed", attempt=8, status_code=0, delivered=False, dead_lettered=True)
    assert delivery_row(final) == ("t8", "job.completed", "8", "no response", "no", "dead-lettered")
    retrying = Delivery(
        at="t1",
        event_type="job.started",
        attempt=1,
        status_code=503,
        delivered=False,
        next_retry_at="t2",
        dead_lettered=False,
    )
    assert delivery_row(retrying) == ("t1", "job.started", "1", "503", "no", "t2")
    assert delivery_row(Delivery()) == ("", "", "", "", "", "")


def test_table_has_one_header_and_a_row_per_try():
    lines = deliveries_table([Delivery(at="t1", attempt=1, status_code=200, delivered=True)]).splitlines()
    assert lines[0].split() == ["TIME", "EVENT", "ATTEMPT", "STATUS", "DELIVERED", "NEXT", "RETRY"]
    assert lines[1].split() == ["t1", "1", "200", "yes"]


def test_documented_names_fill_only_missing_fields():
    d = Delivery.model_validate({"ts": "old", "at": "new", "event": None, "event_type": "job.completed", "ok": True})
    assert (d.at, d.event_type, d.delivered) == ("new", "job.completed", True)
    assert d.model_extra == {}


def test_deliveries_is_a_registered_command():
    args = build_parser().parse_args(["deliveries", "job_01", "--json"])
    assert (args.command, args.job_id, args.json) == ("deliveries", "job_01", True)
