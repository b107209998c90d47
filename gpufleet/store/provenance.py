"""The provenance index: every delivered video's manifest, found by its watermark payload.

Contract:
- An entry (:class:`ProvenanceEntry`) lives in the jobs table at ``WM#<payload>`` /
  ``JOB#<job_id>`` (:func:`gpufleet.tables.watermark_pk`): the job, the watermark key id it was
  embedded under, the keys of the signed video and its manifest store in the outputs bucket, the
  video's SHA-256 and when it was published. The job's outputs (``video.mp4``, ``video.c2pa``) are
  the signed manifest the platform keeps; the entry is what finds them when a copy of the video
  has lost its manifest (stripped, re-encoded, cropped): the watermark still names the payload.
- :meth:`ProvenanceIndex.record` is a conditional put: it lands when there is no entry, or the
  entry already names the same video (a retried Publish); an entry naming another video raises
  :class:`gpufleet.errors.Conflict`. Written by Publish, the step that makes the output visible.
- :meth:`ProvenanceIndex.lookup` returns every entry of a payload (48-bit payloads of distinct
  jobs may collide, so there can be more than one), oldest job first.

In-memory fake: :class:`gpufleet.store.fakes.provenance.MemoryProvenanceIndex`; both are held to one contract suite
(``tests/functional/store/test_store_contract_provenance.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import Conflict
from gpufleet.store.dynamo import error_code, marshal, paginate, reraise, translate_errors
from gpufleet.tables import watermark_pk, watermark_sk

#: the attributes of an entry (the Publish role's put is bound to these)
ENTRY_ATTRIBUTES = ("pk", "sk", "payload", "job_id", "key_id", "video_key", "manifest_key", "video_sha256",
                    "published_at")


@dataclass(frozen=True)
class ProvenanceEntry:
    payload: str
    job_id: str
    key_id: str | None
    video_key: str
    manifest_key: str
    video_sha256: str | None
    published_at: str


class ProvenanceIndex(Protocol):
    def record(self, entry: ProvenanceEntry) -> None: ...

    def lookup(self, payload: str) -> list[ProvenanceEntry]: ...


class DynamoProvenanceIndex:
    """:class:`ProvenanceIndex` in the jobs table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def record(self, entry: ProvenanceEntry) -> None:
        item = {"pk": watermark_pk(entry.payload), "sk": watermark_sk(entry.job_id), **asdict(entry)}
        try:
            self.client.put_item(
                TableName=self.table, Item=marshal(item),
                ConditionExpression="attribute_not_exists(pk) OR video_key = :v",
                ExpressionAttributeValues=marshal({":v": entry.video_key}))
        except ClientError as err:
            if error_code(err) == "ConditionalCheckFailedException":
                raise Conflict(f"the provenance entry of job {entry.job_id} names another video")
            reraise(err)

    def lookup(self, payload: str) -> list[ProvenanceEntry]:
        with translate_errors():
            items = list(paginate(self.client.query, TableName=self.table, KeyConditionExpression="pk = :p",
                                  ExpressionAttributeValues=marshal({":p": watermark_pk(payload)})))
        fields = ProvenanceEntry.__dataclass_fields__
        entries = [ProvenanceEntry(**{k: i.get(k) for k in fields}) for i in items]
        return sorted(entries, key=lambda e: (e.published_at or "", e.job_id))
