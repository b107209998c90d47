"""The layout rules of the repository, checked on its own source with `ast` (see archcheck.py).

- no import cycles among the modules of gpufleet/, onprem_agent/ and lambdas/;
- boto3/botocore imported only by the adapters and entry-point wiring listed in BOTO_ALLOWED;
- DynamoDB writes (so every write of a job item) only under gpufleet/store/ (plus dev-only seeding).
"""

from __future__ import annotations

from pathlib import Path

import archcheck

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpufleet", "onprem_agent", "lambdas")

# Top-level import names that only the AWS adapters may use (fnmatch patterns).
AWS_SDK = ("boto3", "botocore", "mypy_boto3*")

# The only places that may import boto3/botocore (fnmatch patterns on repo-relative paths; `*` spans folders).
BOTO_ALLOWED = (
    "gpufleet/store/*",  # the one adapter floor for DynamoDB, S3 and SQS
    "gpufleet/sdk.py",  # the client SDK signs requests with botocore
    "gpufleet/sdk_*.py",  # the SDK's helper modules
    "gpufleet/local/*",  # local emulation of AWS (moto, batch/lambda runners)
    "gpufleet/devstack/*",  # the dev stack wires local AWS endpoints
    "gpufleet/cli/*",  # the CLI builds clients for its commands
    "onprem_agent/aws.py",  # the agent's one AWS adapter
    "lambdas/*",  # Lambda entry points build their clients
)

# DynamoDB write methods (client and resource style); any attribute of these names outside the store is a write.
DYNAMO_WRITES = (
    "update_item",
    "put_item",
    "delete_item",
    "transact_write_items",
    "batch_write_item",
    "execute_statement",
    "execute_transaction",
    "batch_writer",
)

# The only places that may write DynamoDB items (fnmatch patterns on repo-relative paths).
WRITES_ALLOWED = (
    "gpufleet/store/*",  # every write of a job (or any other item) goes through the store
    "gpufleet/local/*",  # local emulation seeds and patches tables
    "gpufleet/devstack/*",  # the dev stack seeds its tables
)  # not onprem_agent/: a node writes nothing itself, its node item and job reports go through the node API


def test_no_import_cycles():
    cycles = archcheck.import_cycles(ROOT, PACKAGES)
    assert not cycles, archcheck.report("import cycles among gpufleet/, onprem_agent/, lambdas/", cycles)


def test_aws_sdk_imported_only_by_adapters():
    offences = archcheck.forbidden_imports(ROOT, PACKAGES, AWS_SDK, BOTO_ALLOWED)
    assert not offences, archcheck.report(
        "boto3/botocore imported outside the adapters (move the call into gpufleet/store/)", offences
    )


def test_dynamodb_writes_only_in_the_store():
    offences = archcheck.forbidden_attribute_uses(ROOT, PACKAGES, DYNAMO_WRITES, WRITES_ALLOWED)
    assert not offences, archcheck.report("DynamoDB writes outside gpufleet/store/", offences)
