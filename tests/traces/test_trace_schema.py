"""Tests for traces.schema: TraceMeta, make_frame and validate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from unikv.traces.schema import (
    TraceFormatError,
    TraceMeta,
    expected_blocks,
    make_frame,
    meta_of,
    validate,
    with_meta,
)


def _frame(bt: int | None = None, **kw) -> pd.DataFrame:
    args = dict(arrival_s=[0.0, 1.0], prompt_tokens=[10, 20], output_tokens=[1, 2])
    args.update(kw)
    return make_frame(**args, meta=TraceMeta(source="test", format="test", block_tokens=bt))


def test_valid_frame_has_no_violations_and_schema_dtypes():
    df = _frame()
    assert validate(df) == []
    assert list(df.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert df["arrival_s"].dtype == np.float64 and df["prompt_tokens"].dtype == np.int64


def test_meta_round_trips_through_attrs():
    meta = TraceMeta(source="s", format="f", block_tokens=4, dropped={"x": 1}, history=("a",))
    df = with_meta(pd.DataFrame({"a": [1]}), meta)
    assert meta_of(df) == meta
    assert df.attrs["history"] == ["a"]
    assert meta.with_step("b").history == ("a", "b")


def test_meta_rejects_bad_block_size_and_missing_keys():
    with pytest.raises(TraceFormatError, match="block_tokens"):
        TraceMeta(source="s", format="f", block_tokens=0)
    with pytest.raises(TraceFormatError, match="source"):
        TraceMeta.from_attrs({"format": "f"})


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        (dict(arrival_s=[1.0, 0.5]), "decreases at rows 1"),
        (dict(arrival_s=[-1.0, 0.5]), "negative"),
        (dict(arrival_s=[0.0, np.nan]), "not finite"),
        (dict(prompt_tokens=[0, 3]), "prompt_tokens < 1 at rows 0"),
        (dict(output_tokens=[1, -2]), "output_tokens < 1 at rows 1"),
    ],
)
def test_violations_name_the_rows(kw, fragment):
    problems = validate(_frame(**kw))
    assert any(fragment in p for p in problems), problems


def test_missing_column_and_non_frame():
    df = _frame().drop(columns=["output_tokens"])
    assert "missing column(s) ['output_tokens']" in validate(df)[0]
    assert validate([1, 2]) == ["expected a pandas DataFrame, got list"]


def test_missing_attrs_is_a_violation():
    df = _frame()
    df.attrs.clear()
    assert any("source" in p for p in validate(df))


def test_prefix_hashes_are_checked_against_block_size():
    good = _frame(prefix_hashes=[[1, 2, 3], [1, 2, 3, 4, 5]], bt=4)
    assert validate(good) == []
    bad = _frame(prefix_hashes=[[1, 2], ["x"]], bt=4)
    problems = validate(bad)
    assert any("length != ceil" in p and "rows 0" in p for p in problems)
    no_block = _frame(prefix_hashes=[[1], [1]])
    assert any("block_tokens" in p for p in validate(no_block))


def test_hash_lists_of_equal_length_stay_lists():
    df = _frame(prefix_hashes=[[1, 2, 3], [4, 5, 6, 7, 8]], bt=4)
    assert df["prefix_hashes"].iloc[0] == [1, 2, 3]
    df = _frame(prompt_tokens=[4, 4], prefix_hashes=[[1], [2]], bt=4)
    assert df["prefix_hashes"].tolist() == [[1], [2]]


def test_expected_blocks_is_ceil():
    assert [expected_blocks(n, 512) for n in (1, 512, 513, 1024)] == [1, 1, 2, 2]
