"""gpufleet.store.dynamo.unmarshal reads what boto3's TypeDeserializer (then the Decimal → int/float walk) reads."""

from __future__ import annotations

from boto3.dynamodb.types import Binary, TypeDeserializer
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.store.dynamo import _from_dynamo_value, marshal, unmarshal

_de = TypeDeserializer()


def typed(v):
    """``v`` with every value's type kept beside it (1 == 1.0 == True would hide a type change)."""
    if isinstance(v, dict):
        return ("dict", {k: typed(x) for k, x in v.items()})
    if isinstance(v, list):
        return ("list", [typed(x) for x in v])
    if isinstance(v, set):
        return ("set", sorted((typed(x) for x in v), key=repr))
    return (type(v).__name__, v)


def reference(item):
    return {k: _from_dynamo_value(_de.deserialize(v)) for k, v in item.items()}


scalars = st.one_of(
    st.text(max_size=8), st.booleans(), st.none(), st.integers(-10**30, 10**30),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.binary(max_size=4),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-10**6, max_value=10**6),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4),
    st.sets(st.text(max_size=4), min_size=1, max_size=3), st.sets(st.integers(-1000, 1000), min_size=1, max_size=3),
), max_leaves=12)


@given(st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=6))
def test_unmarshal_reads_as_the_type_deserializer_does(doc):
    item = marshal(doc)
    assert typed(unmarshal(item)) == typed(reference(item))


def test_numbers_strings_and_binary_keep_their_types():
    item = {"i": {"N": "42"}, "f": {"N": "1.5"}, "e": {"N": "1E+3"}, "z": {"N": "2.000"}, "b": {"B": b"\x00"},
            "ns": {"NS": ["1", "2.5"]}, "n": {"NULL": True}}
    got = unmarshal(item)
    assert got == {"i": 42, "f": 1.5, "e": 1000, "z": 2, "b": Binary(b"\x00"), "ns": {1, 2.5}, "n": None}
    assert type(got["e"]) is int and type(got["z"]) is int and type(got["f"]) is float
    assert got == reference(item) and unmarshal(None) is None
