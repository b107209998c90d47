"""In-memory :class:`~gpufleet.store.provenance.ProvenanceIndex`: entries keyed as in the jobs table, written
once per job and payload unless the entry already names the same video (a retried Publish); another video is a
:class:`~gpufleet.errors.Conflict`. Lookups return every entry of a payload, oldest job first."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpufleet.errors import Conflict
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.provenance import ProvenanceEntry
from gpufleet.tables import watermark_pk, watermark_sk


@dataclass
class MemoryProvenanceIndex:
    db: MemoryDatabase
    table: str = "jobs"

    def record(self, entry: ProvenanceEntry) -> None:
        item = stored({"pk": watermark_pk(entry.payload), "sk": watermark_sk(entry.job_id), **asdict(entry)})
        with self.db.lock:
            held = self.db.get(self.table, (item["pk"], item["sk"]))
            if held is not None and held.get("video_key") != entry.video_key:
                raise Conflict(f"the provenance entry of job {entry.job_id} names another video")
            self.db.put(self.table, item)

    def lookup(self, payload: str) -> list[ProvenanceEntry]:
        pk = watermark_pk(payload)
        with self.db.lock:
            items = [dict(i) for (p, _), i in self.db.table(self.table).items() if p == pk]
        fields = ProvenanceEntry.__dataclass_fields__
        entries = [ProvenanceEntry(**{k: i.get(k) for k in fields}) for i in items]
        return sorted(entries, key=lambda e: (e.published_at or "", e.job_id))
