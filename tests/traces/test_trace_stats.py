"""Tests for traces.stats: summaries and the infinite-cache prefix hit ratio."""

from __future__ import annotations

import math

import pytest
from unikv.traces import TraceMeta, make_frame
from unikv.traces.stats import format_summary, length_stats, prefix_hit_ratio, summarize


def test_length_stats_percentiles_are_linear():
    s = length_stats([1, 2, 3, 4])
    assert s["mean"] == 2.5 and s["p50"] == 2.5 and s["p90"] == pytest.approx(3.7) and s["max"] == 4
    assert math.isnan(length_stats([])["mean"])


def test_prefix_hit_ratio_strict_prefix():
    refs, unique, ratio = prefix_hit_ratio([[0, 1, 2], [0, 1, 5], [9, 1], [0, 5]])
    # hits: 0, then 2 (0,1), then 0 (9 unseen stops the match), then 2 (0 and 5 seen)
    assert (refs, unique) == (10, 5) and ratio == pytest.approx(4 / 10)


def test_summarize_and_format():
    meta = TraceMeta(source="s", format="f", block_tokens=2, dropped={"failed_responses": 2})
    df = make_frame([0.0, 1.0, 4.0], [3, 4, 1], [1, 2, 3], [[0, 1], [0, 1], [7]], meta=meta)
    s = summarize(df)
    assert s["rows"] == 3 and s["span_s"] == 4.0 and s["rate_rps"] == 0.75
    assert s["prefix"]["block_refs"] == 5 and s["prefix"]["unique_blocks"] == 3
    text = format_summary(s, title="x")
    assert "requests:       3" in text and "0.750 req/s" in text and "prefix reuse:   40.0 %" in text
    assert "dropped:        2" in text


def test_summary_of_untimed_trace():
    df = make_frame([0.0, 0.0], [3, 4], [1, 2], meta=TraceMeta(source="s", format="lengths"))
    text = format_summary(summarize(df))
    assert "n/a (no time span)" in text and "prefix" not in text
