"""In-memory fakes of the store Protocols, for unit tests and offline tools.

Each fake keeps the contract of its DynamoDB implementation (the same conditions, the same
domain errors); one contract suite per entity (``tests/functional/store/test_store_contract_*``)
runs against both, so a fake cannot drift from the real store unnoticed. All fakes of one
test share a :class:`~gpufleet.store.fakes.memory.MemoryDatabase`, whose lock makes a
multi-item write (a job and its idempotency completion, a charge and the job's ``billing``) atomic,
as a DynamoDB transaction is.

Fakes: jobs, idempotency, ratelimit, webhook_endpoints, admin, ledger, nodes, quotas, deliveries,
placements, lease, provenance, snapshot (the pass's reader), queueview, runs (the node API's dispatch record and
gang states), safety_profiles (CheckPrompt's reads; the admin store writes them), queues (a standard SQS queue's
visibility, receive counts and receipt handles on an injected clock), workflow (task tokens, Batch jobs and the
event bus, recording what each was sent), webhook_keys (the tenants' signing secrets and a secret box that opens
only for the sealing tenant), secrets (the Secrets Manager reader), objects (checkpoint tagging and job
outputs over an in-memory bucket), credentials (the STS vendor, recording each vend), diagnosis (a window's
attribution inputs, assembled by the DynamoDB reader's own ``read_window``); ``scheduling.memory_pass_stores``
bundles a whole scheduler pass's stores.
Items go through the marshalling round trip (:func:`gpufleet.store.fakes.jobs.stored`), so they read
back as DynamoDB returns them.
"""
