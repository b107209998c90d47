"""The placement document: where and as which attempt a job runs (pydantic, no scheduler imports).

Contract: the scheduler's commit writes one :class:`Placement` per attempt (``model_dump(mode="json")``)
onto the job item (``placement``) and the attempt item, and resumes the workflow's AwaitPlacement task
with it; the state machine carries it as ``$.placement``; the lifecycle steps parse it with
:meth:`Placement.from_state`; the worker's envelope carries it as ``placement``. Fields:

- ``epoch`` — the attempt's fencing epoch (``attempt`` is the same number);
- ``target`` — ``onprem`` (a node's SQS queue, ``queue_url``) or ``cloud`` (AWS Batch: ``job_queue``,
  ``job_definition``);
- ``pool``, ``node``, ``gpu_indices``, ``gpu_milli`` (thousandths of a GPU per GPU), ``gpu_type``,
  ``price_per_gpu_hour``;
- ``gpu_link`` — the worst link among ``gpu_indices`` as the scheduler chose them (:func:`gpufleet.topology.link_of`:
  ``nvlink``, ``pcie-switch``, …, ``unknown`` when the node reported no topology, ``""`` for one GPU or cloud);
- ``members`` — a gang's nodes (``node``, ``queue_url``, ``gpu_indices``, ``gpu_link`` each), first member first;
  absent (not ``null``) for a single-node placement.

Unknown fields are ignored, so a document written by a newer scheduler still parses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class PlacementMember(BaseModel):
    """One node of a gang placement."""

    model_config = ConfigDict(extra="ignore")

    node: str | None = None
    queue_url: str | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_link: str = ""


class Placement(BaseModel):
    """The placement document (see the module contract)."""

    model_config = ConfigDict(extra="ignore")

    epoch: int = Field(0, ge=0)
    attempt: int = Field(0, ge=0)
    target: Literal["onprem", "cloud"] = "onprem"
    pool: str = ""
    node: str | None = None
    queue_url: str | None = None
    job_queue: str | None = None
    job_definition: str | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_link: str = ""
    gpu_milli: int = Field(1000, ge=0)
    gpu_type: str | None = None
    price_per_gpu_hour: float = 0.0
    members: list[PlacementMember] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_members(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("members") is None:
            data.pop("members", None)
        return data

    @classmethod
    def parse(cls, doc: Mapping[str, Any] | Placement | None) -> Placement | None:
        """The document, or ``None`` when there is none (absent or empty)."""
        if doc is None or isinstance(doc, Placement):
            return doc
        return cls.model_validate(doc) if doc else None

    @classmethod
    def from_state(cls, state: Mapping[str, Any], key: str = "placement") -> Placement | None:
        """The placement a Step Functions state carries at ``key`` (``None`` when it has none)."""
        return cls.parse(state.get(key))

    @property
    def nodes(self) -> frozenset[str]:
        """The on-prem nodes of the placement (its ``node`` and every gang member's); cloud → empty."""
        names = {self.node} | {m.node for m in self.members or ()}
        return frozenset(n for n in names if n)
