"""Contract of :class:`gpufleet.store.quotas.QuotaStore`, on the in-memory fake and on moto.

``put`` creates or replaces a node's configuration and keeps its usage counters (written by placement
transactions); ``read_nodes`` answers every path asked, ``None`` where there is no node, without keys.
"""

from __future__ import annotations

from gpufleet.scheduler.model import QuotaNode
from gpufleet.store.quotas import usage_from_item
from gpufleet.tables import DIR_QUOTAS, DIRECTORY_ATTR, QUOTA_SK, quota_pk


def test_put_then_read_nodes_answers_every_path(backend):
    backend.quotas.put(QuotaNode("t1", guarantee={"h100": 4000}, borrow_limit={"h100": 2000}, weight={"h100": 1.5}))
    backend.quotas.put(QuotaNode("t1/team", guarantee={"*": 1000}))
    got = backend.quotas.read_nodes(["t1", "t1/team", "t1/team/u", "t2"])
    assert list(got) == ["t1", "t1/team", "t1/team/u", "t2"]
    assert got["t1/team/u"] is None and got["t2"] is None
    t1 = got["t1"]
    assert "pk" not in t1 and "sk" not in t1 and t1["path"] == "t1" and t1[DIRECTORY_ATTR] == DIR_QUOTAS
    assert (t1["guarantee"], t1["borrow_limit"], t1["limits"]) == ({"h100": 4000}, {"h100": 2000}, {"h100": 6000})
    assert t1["weight"] == {"h100": 1.5}
    assert got["t1/team"]["guarantee"] == {"*": 1000} and got["t1/team"]["limits"] == {"*": 1000}
    assert backend.quotas.read_nodes([]) == {}


def test_put_replaces_the_configuration_and_keeps_usage_counters(backend):
    backend.quotas.put(QuotaNode("t1", guarantee={"h100": 4000}, weight={"h100": 2.0}))
    # what a placement transaction does to the counters
    backend.set_attrs("control", (quota_pk("t1"), QUOTA_SK), {"used_h100": 3000, "used_all": 3000})
    backend.quotas.put(QuotaNode("t1", guarantee={"a10": 1000}))
    t1 = backend.quotas.read_nodes(["t1"])["t1"]
    assert t1["guarantee"] == {"a10": 1000} and t1["borrow_limit"] == {} and t1["weight"] == {}
    assert usage_from_item(t1) == {"h100": 3000, "*": 3000}
