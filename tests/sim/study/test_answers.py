"""Bisections and gains over synthetic evaluators whose thresholds are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unikv.sim.study.answers import (
    Outcome,
    Side,
    goodput_curve,
    known_threshold,
    max_rate,
    min_budget,
    unified_gain,
)


class Counting:
    """evaluate(x) -> row, meeting the objectives where `meets(x)`; counts calls."""

    def __init__(self, meets) -> None:
        self.meets, self.calls = meets, []

    def __call__(self, x: float) -> dict:
        self.calls.append(x)
        return {"objectives_met": self.meets(x), "goodput_rps": x if self.meets(x) else 0.0,
                "objective_attainment": 1.0 if self.meets(x) else 0.5}


def below(threshold: float) -> Counting:
    return Counting(lambda x: x <= threshold)


def test_max_rate_finds_the_known_threshold_to_the_tolerance():
    ev = below(3.7)
    t = max_rate(ev, lo=0.5, hi=20.0, rel_tol=0.02)
    assert t.outcome is Outcome.FOUND and t.monotone
    assert t.value <= 3.7 < t.miss
    assert t.miss <= t.value * 1.02
    assert t.evaluations == len(ev.calls) == len(set(ev.calls))  # no point run twice
    # geometric bisection: 2 ends + ceil(log2(log(40) / log(1.02))) midpoints at most
    assert len(ev.calls) <= 2 + math.ceil(math.log2(math.log(40) / math.log(1.02)))
    assert sorted(t.rows["rate_scale"]) == sorted(ev.calls)


def test_rerun_over_the_finished_rows_runs_nothing():
    first = max_rate(below(3.7), lo=0.5, hi=20.0, rel_tol=0.02)
    again = below(3.7)
    t = max_rate(again, first.rows, lo=0.5, hi=20.0, rel_tol=0.02)
    assert again.calls == [] and t.evaluations == 0 and t.reused > 0
    assert (t.value, t.miss) == (first.value, first.miss)


def test_finished_grid_rows_tighten_the_bracket():
    grid = pd.DataFrame({"rate_scale": [0.5, 1, 2, 4, 8, 20], "objectives_met": [True] * 3 + [False] * 3})
    fresh, reusing = below(3.7), below(3.7)
    max_rate(fresh, lo=0.5, hi=20.0, rel_tol=0.02)
    t = max_rate(reusing, grid, lo=0.5, hi=20.0, rel_tol=0.02)
    assert t.value <= 3.7 < t.miss <= t.value * 1.02
    # the grid's misses at 4 and 8 say the threshold is below 4: it bisects from (2, 4)
    assert all(2 < x < 4 for x in reusing.calls)
    assert len(reusing.calls) < len(fresh.calls)


def test_non_monotone_rows_are_reported_and_the_answer_stays_conservative():
    rows = pd.DataFrame({"rate_scale": [4.0, 7.5], "objectives_met": [False, True]})
    t = max_rate(below(3.0), rows, lo=1.0, hi=16.0, rel_tol=0.01)
    assert not t.monotone and (7.5, 4.0) in t.inversions
    assert t.value <= 3.0 < t.miss  # the safe side of the lowest miss


def test_no_rate_meets_the_objectives():
    ev = Counting(lambda x: False)
    t = max_rate(ev, lo=1.0, hi=8.0)
    assert t.outcome is Outcome.NONE and t.value is None and t.miss == 1.0
    assert ev.calls == [1.0]


def test_the_highest_rate_tried_still_meets_them():
    ev = Counting(lambda x: True)
    t = max_rate(ev, lo=1.0, hi=8.0)
    assert t.outcome is Outcome.ALL and t.value == 8.0 and t.miss is None
    assert ev.calls == [1.0, 8.0]


def test_min_budget_bisects_on_the_budget():
    ev = Counting(lambda gib: gib >= 12.3)
    t = min_budget(ev, lo=1.0, hi=100.0, rel_tol=0.01)
    assert t.outcome is Outcome.FOUND and t.monotone
    assert t.miss < 12.3 <= t.value <= t.miss * 1.01
    assert set(t.rows["kv_budget_gib"]) == set(ev.calls)
    none = min_budget(Counting(lambda gib: False), lo=1.0, hi=100.0)
    assert none.outcome is Outcome.NONE and none.value is None and none.miss == 100.0
    every = min_budget(Counting(lambda gib: True), lo=1.0, hi=100.0)
    assert every.outcome is Outcome.ALL and every.value == 1.0


def test_known_threshold_reads_the_rows_alone():
    rows = pd.DataFrame({"rate_scale": [8, 1, 4, 2], "objectives_met": [False, True, False, True]})
    t = known_threshold(rows, column="rate_scale")
    assert (t.outcome, t.value, t.miss, t.evaluations) == (Outcome.FOUND, 2.0, 4.0, 0)
    assert t.rel_tol == pytest.approx(1.0)
    budgets = pd.DataFrame({"kv_budget_gib": [10, 20, 40], "objectives_met": [False, True, True]})
    b = known_threshold(budgets, column="kv_budget_gib", side=Side.ABOVE)
    assert (b.outcome, b.value, b.miss) == (Outcome.FOUND, 20.0, 10.0)
    assert known_threshold(rows.assign(objectives_met=True), column="rate_scale").outcome is Outcome.ALL
    with pytest.raises(ValueError, match="no finished row"):
        known_threshold(rows.iloc[:0], column="rate_scale")


def test_goodput_curve_is_sorted_by_rate():
    rows = pd.DataFrame([below(3)(x) | {"rate_scale": x} for x in (4.0, 1.0, 2.0)])
    curve = goodput_curve(rows)
    assert list(curve["rate_scale"]) == [1.0, 2.0, 4.0]
    assert list(curve["goodput_rps"]) == [1.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="lack column\\(s\\) goodput_rps"):
        goodput_curve(rows.drop(columns="goodput_rps"))


def test_unified_gain_over_the_best_deployable_baseline():
    search = {"lo": 0.5, "hi": 32.0, "rel_tol": 0.01}
    maxima = {"sglang": max_rate(below(2.0), **search), "vllm": max_rate(below(3.0), **search),
              "end_end": max_rate(below(4.5), **search), "end_float_end": max_rate(below(99.0), **search),
              "oracle": max_rate(below(9.0), **search)}
    gains = unified_gain(maxima).set_index("layout")
    assert list(gains.index) == ["end_end", "end_float_end"]  # the oracle is no unified layout
    assert (gains["baseline"] == "vllm").all()
    ee = gains.loc["end_end"]
    assert ee["gain"] == pytest.approx(maxima["end_end"].value / maxima["vllm"].value)
    assert ee["gain_low"] <= 4.5 / 3.0 <= ee["gain_high"]
    efe = gains.loc["end_float_end"]  # still meets at the top of the range: a lower bound only
    assert math.isnan(efe["gain"]) and efe["gain_high"] == math.inf
    assert efe["gain_low"] == pytest.approx(32.0 / maxima["vllm"].miss)
    assert unified_gain({"end_end": maxima["end_end"]}).empty


def test_bad_searches_are_refused():
    with pytest.raises(ValueError, match="rate_scale search lo=0 must be a positive finite number"):
        max_rate(below(1), lo=0, hi=2)
    with pytest.raises(ValueError, match="lo=3.0 must be below hi=2.0"):
        max_rate(below(1), lo=3.0, hi=2.0)
    with pytest.raises(ValueError, match="rel_tol=1e-12 must be at least 1e-09"):
        max_rate(below(1), lo=1.0, hi=2.0, rel_tol=1e-12)
    with pytest.raises(ValueError, match="returned a row without 'objectives_met'"):
        max_rate(lambda x: {}, lo=1.0, hi=2.0)
    clash = pd.DataFrame({"rate_scale": [1.0, 1.0], "objectives_met": [True, False]})
    with pytest.raises(ValueError, match="disagree at rate_scale=1.0"):
        max_rate(below(1), clash, lo=1.0, hi=2.0)
    with pytest.raises(ValueError, match="finished rows lack column 'objectives_met'"):
        max_rate(below(1), clash.drop(columns="objectives_met"), lo=1.0, hi=2.0)


@settings(max_examples=60, deadline=None)
@given(threshold=st.floats(0.01, 500.0), lo=st.floats(0.01, 10.0), span=st.floats(1.5, 1000.0),
       rel_tol=st.floats(0.001, 0.5))
def test_bisection_brackets_any_threshold_and_the_cache_never_reruns(threshold, lo, span, rel_tol):
    # 6 significant digits: the cache keys points at 12, so the ends are exactly the points run
    lo, hi = float(f"{lo:.6g}"), float(f"{lo * span:.6g}")
    ev = below(threshold)
    t = max_rate(ev, lo=lo, hi=hi, rel_tol=rel_tol)
    assert len(ev.calls) == len(set(ev.calls)) == t.evaluations
    if threshold < lo:
        assert t.outcome is Outcome.NONE and t.value is None
    elif threshold >= hi:
        assert t.outcome is Outcome.ALL and t.value == hi
    else:
        assert t.outcome is Outcome.FOUND and t.value <= threshold < t.miss <= t.value * (1 + rel_tol)
    again = below(threshold)
    assert max_rate(again, t.rows, lo=lo, hi=hi, rel_tol=rel_tol).value == t.value and again.calls == []


def test_range_ends_of_many_digits_are_the_points_run():
    """The cache keys points at 12 significant digits; an end given with more is still inside the range."""
    lo, hi = 1.349334531863276, 2.698669063726552
    every = max_rate(Counting(lambda x: True), lo=lo, hi=hi)
    assert every.outcome is Outcome.ALL and every.value == pytest.approx(hi, rel=1e-11)
    t = max_rate(below(2.0), lo=lo, hi=hi, rel_tol=0.01)
    assert t.outcome is Outcome.FOUND and t.value <= 2.0 < t.miss


def test_a_known_point_inside_the_range_spares_the_run_at_that_end():
    met_at_1 = pd.DataFrame({"rate_scale": [1.0], "objectives_met": [True]})
    ev = below(3.0)
    t = max_rate(ev, met_at_1, lo=0.25, hi=8.0, rel_tol=0.5)
    assert 0.25 not in ev.calls and ev.calls[0] == 8.0  # 1.0 meets: so does 0.25 (monotone); 8.0 is run
    assert t.outcome is Outcome.FOUND and t.value <= 3.0 < t.miss <= t.value * 1.5
    missed_at_1 = pd.DataFrame({"rate_scale": [1.0], "objectives_met": [False]})
    ev = below(0.4)
    t = max_rate(ev, missed_at_1, lo=0.25, hi=8.0, rel_tol=0.5)
    assert 8.0 not in ev.calls and ev.calls[0] == 0.25
    assert t.outcome is Outcome.FOUND and t.value <= 0.4 < t.miss
