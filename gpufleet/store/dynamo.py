"""DynamoDB plumbing shared by the stores: (de)serialisation, error mapping, pagination, expressions.

Contract: store functions take an explicit low-level ``client`` (boto3
``dynamodb`` client); :func:`gpufleet.store.clients.client` builds one only at
the edges (handlers, CLI). ``ClientError`` never escapes a store: it becomes a
:mod:`gpufleet.errors` exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, NoReturn

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.errors import Conflict, DependencyFailed, TransientError

_ser = TypeSerializer()
_de = TypeDeserializer()

_RETRYABLE = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
}


def _to_dynamo_value(v: Any) -> Any:
    if isinstance(v, float):
        return Decimal(str(v))
    if isinstance(v, dict):
        return {k: _to_dynamo_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_dynamo_value(x) for x in v]
    return v


def _from_dynamo_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, dict):
        return {k: _from_dynamo_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_dynamo_value(x) for x in v]
    if isinstance(v, set):
        return {_from_dynamo_value(x) for x in v}
    return v


def marshal(item: dict[str, Any]) -> dict[str, Any]:
    """Python dict → DynamoDB attribute-value map (floats become Decimals; None dropped)."""
    return {k: _ser.serialize(_to_dynamo_value(v)) for k, v in item.items() if v is not None}


def marshal_value(v: Any) -> dict[str, Any]:
    return _ser.serialize(_to_dynamo_value(v))


def _number(text: str) -> int | float:
    """A DynamoDB number as :func:`unmarshal` gives it: an int when integral, else a float."""
    try:
        return int(text)
    except ValueError:
        d = _de.deserialize({"N": text})  # boto3's context: the same range checks and errors
        return int(d) if d == d.to_integral_value() else float(d)


def _from_attribute(av: dict[str, Any]) -> Any:
    """One attribute value → Python, in one pass (what ``TypeDeserializer`` then :func:`_from_dynamo_value` give)."""
    (tag, v), = av.items()
    if tag == "S":
        return v
    if tag == "N":
        return _number(v)
    if tag == "M":
        return {k: _from_attribute(x) for k, x in v.items()}
    if tag == "L":
        return [_from_attribute(x) for x in v]
    if tag == "BOOL":
        return v
    if tag == "NULL":
        return None
    if tag == "SS":
        return set(v)
    if tag == "NS":
        return {_number(x) for x in v}
    return _from_dynamo_value(_de.deserialize(av))  # B, BS: boto3's Binary, as before


def unmarshal(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """DynamoDB attribute-value map → Python dict (numbers → int when integral, else float). One pass over the
    values: the scheduler's snapshot parses every PENDING job (100,000 items: boto3's deserializer, then a second
    walk converting its Decimals, took 190 µs an item)."""
    if item is None:
        return None
    return {k: _from_attribute(v) for k, v in item.items()}


def error_code(err: ClientError) -> str:
    return err.response.get("Error", {}).get("Code", "")


def cancellation_reasons(err: ClientError) -> list[str]:
    """Codes of a failed TransactWriteItems, one per item ('None' for items that were fine)."""
    reasons = err.response.get("CancellationReasons") or []
    if reasons:
        return [r.get("Code", "None") for r in reasons]
    # Some implementations only put them in the message: "... [None, ConditionalCheckFailed]"
    msg = err.response.get("Error", {}).get("Message", "")
    if "[" in msg and "]" in msg:
        inner = msg[msg.rfind("[") + 1 : msg.rfind("]")]
        return [p.strip() for p in inner.split(",")]
    return []


@contextmanager
def translate_errors(conflict: type[Exception] = Conflict, detail: str = "") -> Iterator[None]:
    """Map botocore errors to domain errors, so none escapes a store: condition failures →
    ``conflict``; throttling, 5xx answers and connection failures → :class:`TransientError`;
    anything else (access denied, a missing table, a malformed request) → :class:`DependencyFailed`."""
    try:
        yield
    except ClientError as err:
        code = error_code(err)
        if code in ("ConditionalCheckFailedException", "TransactionCanceledException"):
            raise conflict(detail or code) from err
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _RETRYABLE or code == "TransactionConflictException" or status >= 500:
            raise TransientError(f"{code}: {err}") from err
        raise DependencyFailed(f"{code}: {err}") from err
    except BotoCoreError as err:  # no answer at all (endpoint unreachable, timeout, ...)
        raise TransientError(f"{type(err).__name__}: {err}") from err


def paginate(call: Callable[..., dict[str, Any]], *, limit: int | None = None, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every item of a ``query``/``scan`` (``call``, e.g. ``client.query``), page after page, unmarshalled.

    Stops after ``limit`` items when given. ``kwargs`` are the request's parameters; the
    ``ExclusiveStartKey`` of each next page is added here.
    """
    count = 0
    while True:
        resp = call(**kwargs)
        for raw in resp.get("Items", []):
            if limit is not None and count >= limit:
                return
            count += 1
            yield unmarshal(raw)
        lek = resp.get("LastEvaluatedKey")
        if not lek or (limit is not None and count >= limit):
            return
        kwargs = {**kwargs, "ExclusiveStartKey": lek}


def update_expression(
    set_attrs: Mapping[str, Any] | None = None, remove: Iterable[str] = (), *, tag: str = "s"
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``SET #<tag>0 = :<tag>0, ... REMOVE #<tag>r0, ...`` for ``set_attrs`` (plain values, marshalled
    here) and the attribute names in ``remove`` → (expression, names map, values map).

    ``tag`` keeps the placeholders apart from others the caller adds to the same request.
    """
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    sets, removes = [], []
    for i, (k, v) in enumerate((set_attrs or {}).items()):
        names[f"#{tag}{i}"] = k
        values[f":{tag}{i}"] = marshal_value(v)
        sets.append(f"#{tag}{i} = :{tag}{i}")
    for i, r in enumerate(dict.fromkeys(remove)):
        names[f"#{tag}r{i}"] = r
        removes.append(f"#{tag}r{i}")
    parts = (["SET " + ", ".join(sets)] if sets else []) + (["REMOVE " + ", ".join(removes)] if removes else [])
    return " ".join(parts), names, values


def conditional_write(call: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any] | None:
    """Run one conditional write (``call``, e.g. ``client.update_item``) with ``kwargs``.

    Returns its response, or None when its condition failed. Other errors are mapped as by
    :func:`translate_errors`.
    """
    try:
        return call(**kwargs)
    except ClientError as err:
        if error_code(err) == "ConditionalCheckFailedException":
            return None
        with translate_errors():
            raise

def reraise(err: ClientError, conflict: type[Exception] = Conflict, detail: str = "") -> NoReturn:
    """Raise ``err`` as :func:`translate_errors` maps it (for an ``except ClientError`` branch)."""
    with translate_errors(conflict, detail):
        raise err
    raise AssertionError("unreachable")  # pragma: no cover


def set_clause(attrs: Mapping[str, Any], names: dict[str, str], values: dict[str, Any], tag: str = "x") -> list[str]:
    """The ``#<tag>i = :<tag>i`` assignments of :func:`update_expression` for ``attrs``, with their names and
    values added to ``names`` / ``values`` (for a caller that assembles a larger expression)."""
    expr, more_names, more_values = update_expression(attrs, tag=tag)
    names.update(more_names)
    values.update(more_values)
    return expr.removeprefix("SET ").split(", ") if expr else []


def marshal_values(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Plain Python expression values (keyed ``:name``) marshalled."""
    return {k: marshal_value(v) for k, v in (values or {}).items()}
