"""The lifecycle's capacity release (``Deps.release``) as the store does it, recorded: an attempt's booking goes back
once (the call that freed it returns True; later calls, e.g. a retried step's, free nothing and return False). The
log is the list of releases that freed something, in order."""

from __future__ import annotations


class ReleaseLog(list):
    def __call__(self, job_id: str, epoch: int) -> bool:
        if (job_id, epoch) in self:
            return False
        self.append((job_id, epoch))
        return True
