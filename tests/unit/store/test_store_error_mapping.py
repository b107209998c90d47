"""No botocore error escapes a store: each maps to a gpufleet.errors exception."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from gpufleet.errors import Conflict, DependencyFailed, NotFound, TransientError
from gpufleet.store.dynamo import reraise, translate_errors


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("ConditionalCheckFailedException", 400, Conflict),
        ("TransactionCanceledException", 400, Conflict),
        ("ProvisionedThroughputExceededException", 400, TransientError),
        ("TransactionConflictException", 400, TransientError),
        ("InternalServerError", 500, TransientError),
        ("SomethingNew", 503, TransientError),
        ("AccessDeniedException", 400, DependencyFailed),
        ("ResourceNotFoundException", 400, DependencyFailed),
        ("ValidationException", 400, DependencyFailed),
    ],
)
def test_every_client_error_becomes_a_domain_error(code, status, expected):
    with pytest.raises(expected) as got, translate_errors():
        raise client_error(code, status)
    assert not isinstance(got.value, ClientError) and isinstance(got.value.__cause__, ClientError)
    with pytest.raises(expected):
        reraise(client_error(code, status))


def test_condition_failures_map_to_the_callers_conflict_type():
    with pytest.raises(NotFound), translate_errors(NotFound, "gone"):
        raise client_error("ConditionalCheckFailedException")


def test_no_answer_at_all_is_transient():
    with pytest.raises(TransientError), translate_errors():
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
