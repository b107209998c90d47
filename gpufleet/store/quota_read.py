"""Read-only views of the quota tree for ``GET /v1/quota`` (control table ``QUOTA#<path>`` / ``QUOTA``).

Contract: :func:`read_quota_nodes` returns, for each path asked (``tenant``,
``tenant/team``, ``tenant/team/user``), the stored quota node without key
attributes, or ``None`` when the path has no node. The quota items are written
by the scheduler (gpufleet/scheduler); this module never writes them.
"""

from __future__ import annotations

from typing import Any

from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.tables import quota_pk

SK = "QUOTA"


def read_quota_nodes(client, table: str, paths: list[str]) -> dict[str, dict[str, Any] | None]:
    keys = [marshal({"pk": quota_pk(p), "sk": SK}) for p in paths]
    found: dict[str, dict[str, Any] | None] = {p: None for p in paths}
    request: dict[str, Any] = {table: {"Keys": keys, "ConsistentRead": True}}
    while request:
        resp = client.batch_get_item(RequestItems=request)
        for raw in resp.get("Responses", {}).get(table, []):
            item = unmarshal(raw) or {}
            path = item["pk"][len("QUOTA#") :]
            found[path] = {k: v for k, v in item.items() if k not in ("pk", "sk")}
        request = resp.get("UnprocessedKeys") or {}
    return found
