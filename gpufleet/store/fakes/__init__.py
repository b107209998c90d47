"""In-memory fakes of the store Protocols, for unit tests and offline tools.

Each fake keeps the contract of its real store (the same conditions, the same domain errors); one contract suite
per entity (``tests/functional/store/test_store_contract_*``) runs against both, so a fake cannot drift from the
real store unnoticed. All DynamoDB fakes of one test share a :class:`~gpufleet.store.fakes.memory.MemoryDatabase`,
whose lock makes a multi-item write (a job and its idempotency completion, a charge and the job's ``billing``)
atomic, as a DynamoDB transaction is. Items go through the marshalling round trip
(:func:`gpufleet.store.fakes.jobs.stored`), so they read back as DynamoDB returns them.

Fakes (module: what it stands in for):

- DynamoDB: jobs, idempotency, ratelimit, webhook_endpoints, admin, ledger, nodes, quotas, deliveries, placements,
  lease, provenance, snapshot (the pass's reader), queueview, runs (the node API's dispatch record and gang
  states), safety_profiles (CheckPrompt's reads; the admin store writes them), webhook_keys (the tenants' signing
  secrets, and a secret box that opens only for the sealing tenant), diagnosis (a window's attribution inputs);
  ``scheduling.memory_pass_stores`` bundles a whole scheduler pass's stores.
- SQS: queues (a standard queue's visibility, receive counts and receipt handles on an injected clock).
- Step Functions, Batch, EventBridge: workflow (task tokens, Batch jobs, the event bus; each records what it was
  sent).
- Batch job definitions: jobdefs (each ``RegisterJobDefinition`` recorded).
- Secrets Manager: secrets. S3: objects (checkpoint tagging, job outputs). STS: credentials (each vend recorded).
"""
