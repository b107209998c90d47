"""Node items of the control table (``NODE#<id>`` / ``NODE``): one per agent, capacity and heartbeat.

Agents write their own item (docs/contracts.md, "Node item"); the scheduler reads them in its
snapshot (:mod:`gpufleet.store.snapshot`). :meth:`NodeStore.put` writes one as an agent would, for
tests, benchmarks and the local stack. AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.store.dynamo import marshal, translate_errors
from gpufleet.tables import NODE_SK, node_pk


def put_node(client, table: str, node: dict[str, Any]) -> None:
    """Write a node item (``node["node_id"]`` names it) as an agent would."""
    with translate_errors():
        client.put_item(TableName=table, Item=marshal({"pk": node_pk(node["node_id"]), "sk": NODE_SK, **node}))


class NodeStore(Protocol):
    def put(self, node: dict[str, Any]) -> None: ...


class DynamoNodeStore:
    """:class:`NodeStore` over the control table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def put(self, node: dict[str, Any]) -> None:
        put_node(self.client, self.table, node)
