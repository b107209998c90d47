"""Admission at submission (pure): what a tenant may ask the platform to run and to read for it.

Contract (refusals are 403 ``not-allowed`` problems naming the field; see docs/api.md):
- ``workload.image`` (container jobs) must match the site's image allowlist
  (:mod:`gpufleet.images`; setting ``GPUFLEET_IMAGE_ALLOWLIST``).
- Every ``data.inputs`` URI must be the tenant's own: ``s3://<bucket>/tenants/<tenant>/<key>``
  in a platform data bucket (the outputs bucket or one of ``GPUFLEET_INPUT_BUCKETS``), or any
  key of a bucket registered to the tenant (``GPUFLEET_TENANT_BUCKETS``: ``{tenant: [bucket]}``).
  Keys with empty, ``.`` or ``..`` segments are refused, so a prefix cannot be escaped by
  whatever later normalizes the key (the rule is :func:`gpufleet.ownership.input_owned`). The node API
  applies it again when it vends an attempt's object credentials: an input that is not the job's tenant's
  is left out of the session (defence in depth, should a spec ever reach an attempt unchecked).
- A container job whose image is named by tag only (no ``@sha256:<digest>``) runs on-prem only: cloud pools
  run a container job under a Batch definition of its image's digest (:mod:`gpufleet.batchdef`; a tag can
  move), so the scheduler keeps such a job off cloud pools (``fits-ever``) and a job whose ``pools`` are all
  cloud pools is refused here with a 400 ``validation`` problem naming ``workload.image``
  (:func:`check_cloud_image`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.errors import NotAllowed, ValidationFailed
from gpufleet.images import allowed, normalize
from gpufleet.ownership import input_owned
from gpufleet.pools import Pool
from gpufleet.spec import ContainerJob, JobSpec


def check_image(spec: JobSpec, allowlist: list[str]) -> None:
    w = spec.workload
    if isinstance(w, ContainerJob) and not allowed(w.image, allowlist):
        raise NotAllowed(f"image {w.image!r} is not in this site's image allowlist", field="workload.image")


def check_cloud_image(spec: JobSpec, pools: Iterable[Pool]) -> None:
    """Refuse a tag-only container image when every pool the job allows is a cloud pool (see module)."""
    w = spec.workload
    if not isinstance(w, ContainerJob) or normalize(w.image)[2] is not None:
        return
    by_name = {p.name: p for p in pools}
    names = list(spec.pools) or list(by_name)
    if names and all(n in by_name and by_name[n].kind.is_cloud for n in names):
        raise ValidationFailed(
            f"image {w.image!r} is named by tag only: cloud pools ({', '.join(names)}) run images by digest "
            "(repository@sha256:...); pin the digest or allow an on-prem pool", field="workload.image")


def check_inputs(spec: JobSpec, tenant: str, data_buckets: set[str], tenant_buckets: set[str]) -> None:
    for i, uri in enumerate(spec.data.inputs):
        if not input_owned(uri, tenant, data_buckets, tenant_buckets):
            raise NotAllowed(f"input {uri!r} is not tenant {tenant}'s: use s3://<data bucket>/tenants/{tenant}/... "
                             "or a bucket registered to the tenant", field=f"data.inputs.{i}")
