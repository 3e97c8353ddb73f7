"""Tests for traces.transforms: pure functions that keep metadata."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from unikv.traces import TraceFormatError, TraceMeta, make_frame, validate
from unikv.traces.transforms import (
    clip_to_context,
    concat,
    repeat,
    scale_rate,
    spread_buckets,
    subsample,
    window,
)


def _trace(n: int = 10, hashes: bool = False) -> pd.DataFrame:
    prompt = np.arange(1, n + 1) * 3
    ids = [list(range(100 * i, 100 * i + -(-p // 4))) for i, p in enumerate(prompt)] if hashes else None
    meta = TraceMeta(source="t", format="test", block_tokens=4 if hashes else None)
    return make_frame(np.arange(n, dtype=float), prompt, np.full(n, 5), ids, meta=meta)


def test_window_rezeroes_and_records_history():
    df = _trace()
    out = window(df, start_s=2.0, end_s=5.0)
    assert out["arrival_s"].tolist() == [0.0, 1.0, 2.0]
    assert out.attrs["history"] == ["window(start_s=2.0, end_s=5.0)"] and out.attrs["source"] == "t"
    assert df.attrs["history"] == [] and len(df) == 10  # input untouched
    assert len(window(df, start_s=3.0)) == 7
    with pytest.raises(TraceFormatError):
        window(df, start_s=5, end_s=2)


def test_scale_rate():
    out = scale_rate(_trace(), factor=2.0)
    assert out["arrival_s"].iloc[-1] == 4.5
    with pytest.raises(TraceFormatError, match="positive"):
        scale_rate(_trace(), factor=0)


def test_subsample_is_seeded_and_ordered():
    df = _trace(100)
    a, b = subsample(df, fraction=0.25, seed=1), subsample(df, n=25, seed=1)
    assert len(a) == 25 and a["arrival_s"].tolist() == b["arrival_s"].tolist()
    assert np.all(np.diff(a["arrival_s"]) > 0) and validate(a) == []
    with pytest.raises(TraceFormatError, match="exactly one"):
        subsample(df)
    with pytest.raises(TraceFormatError):
        subsample(df, n=101)


def test_clip_truncates_prompt_output_and_hashes():
    df = _trace(10, hashes=True)  # prompts 3..30 tokens, output 5, block 4
    out = clip_to_context(df, max_context_tokens=12)
    assert ((out["prompt_tokens"] + out["output_tokens"]) <= 12).all()
    assert out["prompt_tokens"].max() == 11 and validate(out) == []
    assert out["prefix_hashes"].iloc[-1] == df["prefix_hashes"].iloc[-1][:3]
    assert df["prefix_hashes"].iloc[-1] == list(range(900, 908))  # input untouched


def test_clip_drop_mode_counts():
    out = clip_to_context(_trace(), max_context_tokens=20)
    dropped = clip_to_context(_trace(), max_context_tokens=20, mode="drop")
    assert len(out) == 10 and len(dropped) == 5 and dropped.attrs["dropped"]["over_context"] == 5
    with pytest.raises(TraceFormatError, match="mode"):
        clip_to_context(_trace(), max_context_tokens=20, mode="x")


def test_spread_buckets_keeps_order_inside_buckets():
    meta = TraceMeta(source="t", format="test")
    df = make_frame([0, 0, 0, 3, 3], [1, 2, 3, 4, 5], [1] * 5, meta=meta)
    out = spread_buckets(df, width_s=3.0, seed=0)
    assert out["prompt_tokens"].tolist() == [1, 2, 3, 4, 5] and validate(out) == []
    t = out["arrival_s"].to_numpy()
    assert (t[:3] < 3).all() and (t[3:] >= 3).all()
    assert spread_buckets(df, width_s=3.0, seed=0)["arrival_s"].tolist() == t.tolist()


def test_concat_places_traces_back_to_back_with_disjoint_hashes():
    a, b = _trace(3, hashes=True), _trace(2, hashes=True)
    out = concat([a, b], gap_s=1.0)
    assert out["arrival_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and validate(out) == []
    first = {x for h in out["prefix_hashes"][:3] for x in h}
    second = {x for h in out["prefix_hashes"][3:] for x in h}
    assert not first & second
    shared = concat([a, b], disjoint_hashes=False)
    assert shared["prefix_hashes"].iloc[3] == a["prefix_hashes"].iloc[0]
    assert "concat(2 traces" in out.attrs["history"][0]


def test_concat_refuses_mixed_frames():
    with pytest.raises(TraceFormatError, match="some frames have prefix_hashes"):
        concat([_trace(hashes=True), _trace()])
    with pytest.raises(TraceFormatError, match="at least one"):
        concat([])


def test_repeat():
    out = repeat(_trace(3), times=3, gap_s=0.5)
    assert out["arrival_s"].tolist() == [0, 1, 2, 2.5, 3.5, 4.5, 5.0, 6.0, 7.0]
    assert out.attrs["history"][-1].startswith("repeat(times=3")
    with pytest.raises(TraceFormatError):
        repeat(_trace(), times=0)


def test_transforms_on_empty_frames():
    empty = window(_trace(), start_s=100.0)
    assert len(empty) == 0 and validate(empty) == []
    assert len(scale_rate(empty, factor=2)) == 0 and len(spread_buckets(empty, width_s=1.0)) == 0
    assert len(concat([empty, _trace(2)])) == 2
