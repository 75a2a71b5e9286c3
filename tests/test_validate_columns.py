"""The column conversions of tracediag.ingest.validate take Arrow's C conversion when a column is plain numbers and
the value-by-value path otherwise: both must give the same column and the same bad records, whatever the values
(generated mixes of the types a JSON decoder gives, plus the edges: 2**53, 2**63, bools, nested lists)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tracediag.ingest import validate as val

EDGE_INTS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**53, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**70, -(2**64)]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, -0.0, 1e300, 3.0, 2.0**53]),
    st.text(max_size=4),
    st.just([1, 2]),
    st.just({"a": 1}),
)
# mostly one kind, as a real column is, with others mixed in
COLUMNS = st.one_of(
    st.lists(VALUES, max_size=30),
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=30),
    st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=2**31 - 1)), max_size=30),
    st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), max_size=30),
)


def _floats_by_value(values, none=math.nan):
    """The value-by-value conversion: _floats with Arrow's path turned off."""
    fast = val._arrow_numbers
    val._arrow_numbers = lambda values: None
    try:
        return val._floats(values, none)
    finally:
        val._arrow_numbers = fast


@settings(max_examples=400, deadline=None)
@given(COLUMNS)
@example([0.0, False])  # Arrow reads a bool after a float as 0.0 / 1.0; here it is not a number
@example([0.5, True, None, 1])
def test_floats_are_those_of_the_value_by_value_conversion(values):
    for none in (math.nan, 0.0):
        got = val._floats(values, none=none)
        assert got.dtype == np.float64 and got.flags.writeable
        assert np.array_equal(got, _floats_by_value(values, none), equal_nan=True), (values, none)


@settings(max_examples=400, deadline=None)
@given(COLUMNS, st.sampled_from([(pa.int32(), 1, 2**31 - 1), (pa.int64(), None, None), (pa.int64(), 0, 2**53)]))
def test_int_columns_and_bad_records_are_those_of_the_value_by_value_check(values, spec):
    typ, lo, hi = spec
    fast_bad, slow_bad = val.BadRecords(), val.BadRecords()
    got = val.Checker(fast_bad, "t").ints("f", values, typ, lo, hi)
    half = 2**31 if typ == pa.int32() else 2**63
    lo = -half if lo is None else lo
    hi = half - 1 if hi is None else hi
    want = pa.array(val.Checker(slow_bad, "t").int_values("f", values, lo, hi), typ)
    assert got.type == want.type and got.equals(want), values
    assert fast_bad.to_meta() == slow_bad.to_meta()
