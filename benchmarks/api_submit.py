"""Benchmark: POST /v1/jobs through the API handler on moto, against one bare DynamoDB conditional put.

Both run in the same process against the same moto DynamoDB, interleaved in
rounds so load drift on the machine hits both alike. The tables are recreated
at the start of every round: moto's TransactWriteItems deep-copies the tables
(for its rollback), so its cost grows with table size, which DynamoDB's does not. The handler path is what
the Lambda runs: Powertools routing and validation, principal lookup,
idempotency claim, soft-quota counts, one TransactWriteItems (job + event +
idempotency completion), problem mapping, structured log and EMF metrics.
The baseline is one ``PutItem`` with ``attribute_not_exists(pk)`` of an item of
the same size. Figures: submissions/s, p50/p99 latency, ratios to the baseline,
and DynamoDB requests per submission.

Run: ``.venv/bin/python benchmarks/api_submit.py [--n 150] [--rounds 5]``
The last line of output is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_ENDPOINT_URL", None)
os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from gpufleet.api.settings import load  # noqa: E402
from gpufleet.api.wiring import build_api  # noqa: E402
from gpufleet.clock import SystemClock  # noqa: E402
from gpufleet.devstack.gateway import build_event  # noqa: E402
from gpufleet.store.principals import put_principal  # noqa: E402
from gpufleet.store.schema import create_tables  # noqa: E402
from gpufleet.tables import TableNames  # noqa: E402

REGION = "us-east-1"
USERS = 40  # spread over 4 teams so no one reaches the soft quota
BODY = json.dumps(
    {"workload": {"kind": "video.generate", "prompt": "a red fox running through fresh snow at dawn"}}
).encode()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=150, help="submissions (and baseline puts) in total")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (fresh tables each)")
    args = ap.parse_args(argv)
    logging.disable(logging.INFO)
    arns = [f"arn:aws:iam::123456789012:user/u{i}" for i in range(USERS)]
    names = TableNames()

    def fresh_tables(ddb) -> None:
        for t in ddb.list_tables()["TableNames"]:
            ddb.delete_table(TableName=t)
        create_tables(ddb, names)
        for i, arn in enumerate(arns):
            put_principal(ddb, names.control, arn, "bench", f"team{i % 4}", f"u{i}")

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        fresh_tables(ddb)
        api = build_api(load(cursor_secret="benchmark-secret-0123456789"), ddb=ddb, clock=SystemClock())
        calls = {"n": 0, "t0": 0.0, "in_ddb": 0.0}

        per_op: dict[str, list[float]] = {}

        def before(**_):
            calls["n"] += 1
            calls["t0"] = time.perf_counter()

        def after(model=None, **_):
            dt = time.perf_counter() - calls["t0"]
            calls["in_ddb"] += dt
            if calls.get("recording"):
                per_op.setdefault(model.name if model is not None else "?", []).append(dt)

        ddb.meta.events.register("before-call.dynamodb.*", before)
        ddb.meta.events.register("after-call.dynamodb.*", after)
        ddb_time_api = 0.0

        # One warm-up call each (Powertools builds route models lazily: the cold start is not measured).
        with contextlib.redirect_stdout(io.StringIO()):
            api.handle(
                build_event(
                    "POST",
                    "/v1/jobs",
                    {"Idempotency-Key": "warm", "Content-Type": "application/json"},
                    BODY,
                    user_arn=arns[0],
                )
            )
        stored_size = None
        api_lat, put_lat = [], []
        api_time = put_time = 0.0
        per_round = args.n // args.rounds
        calls_before = 0
        k = 0
        for r in range(args.rounds):
            fresh_tables(ddb)
            # handler
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink):
                t_round = time.perf_counter()
                calls_before_round = calls["n"]
                calls["recording"] = True
                ddb_before_round = calls["in_ddb"]
                for _ in range(per_round):
                    ev = build_event(
                        "POST",
                        "/v1/jobs",
                        {"Idempotency-Key": f"k{k}", "Content-Type": "application/json"},
                        BODY,
                        user_arn=arns[k % USERS],
                    )
                    t0 = time.perf_counter()
                    resp = api.handle(ev)
                    api_lat.append(time.perf_counter() - t0)
                    if resp["statusCode"] != 202:
                        raise SystemExit(f"unexpected {resp['statusCode']}: {resp['body']}")
                    if stored_size is None:
                        stored_size = len(resp["body"])
                    k += 1
                api_time += time.perf_counter() - t_round
                calls["recording"] = False
                calls_before += calls["n"] - calls_before_round
                ddb_time_api += calls["in_ddb"] - ddb_before_round
            # baseline: one conditional put of a same-size item
            pad = "x" * max(0, (stored_size or 600) - 100)
            t_round = time.perf_counter()
            for i in range(per_round):
                t0 = time.perf_counter()
                ddb.put_item(
                    TableName=names.jobs,
                    Item={"pk": {"S": f"BASE#{r}#{i}"}, "sk": {"S": "META"}, "pad": {"S": pad}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
                put_lat.append(time.perf_counter() - t0)
            put_time += time.perf_counter() - t_round

    n = per_round * args.rounds
    api_rate, put_rate = n / api_time, n / put_time
    out = {
        "submissions": n,
        "api_submissions_per_s": round(api_rate, 1),
        "api_p50_ms": round(statistics.median(api_lat) * 1000, 2),
        "api_p99_ms": round(pct(api_lat, 99) * 1000, 2),
        "put_per_s": round(put_rate, 1),
        "put_p50_ms": round(statistics.median(put_lat) * 1000, 2),
        "put_p99_ms": round(pct(put_lat, 99) * 1000, 2),
        "ratio_p50": round(statistics.median(api_lat) / statistics.median(put_lat), 2),
        "ratio_p99": round(pct(api_lat, 99) / pct(put_lat, 99), 2),
        "ratio_throughput": round(put_rate / api_rate, 2),
        "dynamodb_requests_per_submission": round(calls_before / n, 2),
        "dynamodb_share_of_handler_time": round(ddb_time_api / api_time, 2),
        "moto_p50_ms_by_operation": {k: round(statistics.median(v) * 1000, 2) for k, v in sorted(per_op.items())},
    }
    print(
        f"POST /v1/jobs via handler on moto: {out['api_submissions_per_s']}/s, "
        f"p50 {out['api_p50_ms']} ms, p99 {out['api_p99_ms']} ms"
    )
    print(
        f"bare conditional PutItem on moto:  {out['put_per_s']}/s, p50 {out['put_p50_ms']} ms, p99 {out['put_p99_ms']} ms"
    )
    print(
        f"ratio handler/put: p50 x{out['ratio_p50']}, p99 x{out['ratio_p99']}, throughput x{out['ratio_throughput']}; "
        f"{out['dynamodb_requests_per_submission']} DynamoDB requests per submission "
        f"({out['dynamodb_share_of_handler_time'] * 100:.0f}% of handler time inside moto DynamoDB calls)"
    )
    print("moto DynamoDB p50 by operation inside the handler (ms):", out["moto_p50_ms_by_operation"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
