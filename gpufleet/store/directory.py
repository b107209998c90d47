"""The control table's directory index (gsi2): listing its items by kind instead of scanning the table.

Contract:
- Every writer of a node liveness item, a BOOK/POOL counter, an allocation record or a quota node sets
  ``gsi2pk`` = :func:`gpufleet.tables.directory_of` (``DIR#NODES``, ``DIR#USAGE``, ``DIR#ALLOCATIONS``,
  ``DIR#QUOTAS``); :func:`gpufleet.store.snapshot.query_directory` lists one partition.
- :func:`backfill` is the operator's one-off for a table written before the index existed: it scans the
  control table (operator credentials; no function role may Scan) and sets ``gsi2pk`` on every item of
  those kinds that lacks it or has another value, each write conditioned on the item still existing.
  Returns how many items it listed. AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from gpufleet.store.dynamo import error_code, marshal, paginate, translate_errors
from gpufleet.tables import DIRECTORY_ATTR, directory_of


def backfill(client, table: str) -> int:
    """Set the directory partition on every control-table item of a listed kind that lacks it."""
    with translate_errors():
        items = list(paginate(client.scan, TableName=table, ProjectionExpression="pk, sk, #d",
                              ExpressionAttributeNames={"#d": DIRECTORY_ATTR}))
    listed = 0
    for it in items:
        part = directory_of(it["pk"], it["sk"])
        if part is None or it.get(DIRECTORY_ATTR) == part:
            continue
        try:
            client.update_item(TableName=table, Key=marshal({"pk": it["pk"], "sk": it["sk"]}),
                               UpdateExpression="SET #d = :d", ConditionExpression="attribute_exists(pk)",
                               ExpressionAttributeNames={"#d": DIRECTORY_ATTR},
                               ExpressionAttributeValues={":d": {"S": part}})
        except ClientError as err:
            if error_code(err) == "ConditionalCheckFailedException":
                continue  # deleted meanwhile (a released allocation)
            with translate_errors():
                raise
        listed += 1
    return listed
