"""Objectives against hand-made request tables (every number checkable by hand)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from unikv.sim.objectives import Objectives, PercentileTarget, evaluate, nearest_rank

NAN = math.nan


def table(rows: list[tuple]) -> pd.DataFrame:
    """Rows of (ttft_s, tpot_s, finished, rejected, output_tokens)."""
    return pd.DataFrame([
        {"ttft_s": ttft, "tpot_s": tpot, "finished_s": 1.0 if done else NAN, "rejected": rej,
         "output_tokens": out}
        for ttft, tpot, done, rej, out in rows])


P90 = Objectives(percentile_targets=(PercentileTarget(metric="ttft", percentile=90, max_s=2.0),
                                     PercentileTarget(metric="tpot", percentile=90, max_s=0.05)))


def test_nearest_rank_is_the_ceil_rank():
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert nearest_rank(values, 90) == 9.0  # ceil(9.0) = 9th
    assert nearest_rank(values, 91) == 10.0  # ceil(9.1) = 10th
    assert nearest_rank(values, 50) == 5.0
    assert nearest_rank(values, 100) == 10.0
    assert math.isnan(nearest_rank([], 90))


def test_attainment_and_goodput_by_hand():
    # 10 requests: 7 within both, 1 TTFT too slow, 1 TPOT too slow, 1 rejected
    rows = [(1.0, 0.01, True, False, 10)] * 7
    rows += [(3.0, 0.01, True, False, 10), (1.0, 0.09, True, False, 10), (NAN, NAN, False, True, 10)]
    out = evaluate(table(rows), P90, duration_s=4.0)
    assert out["met_requests"] == 7
    assert out["objective_attainment"] == pytest.approx(0.7)
    assert out["goodput_rps"] == pytest.approx(7 / 4.0)
    # TTFT sorted: seven 1.0, 1.0 (the TPOT-slow one), 3.0, inf -> 9th = 3.0
    assert out["objective_ttft_p90_s"] == 3.0
    assert out["objective_tpot_p90_s"] == 0.09
    assert out["objectives_met"] is False


def test_percentile_target_holds_exactly_at_the_rank():
    # 9 of 10 within 2 s: p90 holds; the 10th (unfinished) is +inf
    rows = [(1.0, 0.01, True, False, 10)] * 9 + [(0.5, NAN, False, False, 10)]
    out = evaluate(table(rows), P90, duration_s=1.0)
    assert out["objective_ttft_p90_s"] == 1.0
    assert out["objectives_met"] is True
    # the unfinished request misses even though its first token came early
    assert out["met_requests"] == 9
    p95 = Objectives(percentile_targets=(PercentileTarget(metric="ttft", percentile=95, max_s=2.0),))
    assert evaluate(table(rows), p95, duration_s=1.0)["objective_ttft_p95_s"] == math.inf
    assert evaluate(table(rows), p95, duration_s=1.0)["objectives_met"] is False


def test_one_token_requests_have_no_tpot_and_meet_it():
    rows = [(1.0, NAN, True, False, 1), (1.0, 0.2, True, False, 5)]
    out = evaluate(table(rows), P90, duration_s=1.0)
    assert out["met_requests"] == 1  # the 5-token one misses TPOT, the 1-token one meets it
    assert out["objective_tpot_p90_s"] == 0.2  # over the one request with a TPOT
    only_one = evaluate(table(rows[:1]), P90, duration_s=1.0)
    assert math.isnan(only_one["objective_tpot_p90_s"]) and only_one["objectives_met"] is True


def test_zero_finished_requests():
    rows = [(NAN, NAN, False, True, 10), (4.0, NAN, False, False, 10)]
    out = evaluate(table(rows), P90, duration_s=0.0)
    assert out["met_requests"] == 0 and out["objective_attainment"] == 0.0 and out["goodput_rps"] == 0.0
    assert out["objective_ttft_p90_s"] == math.inf and out["objectives_met"] is False


def test_request_targets_default_to_the_tightest_percentile_target():
    obj = Objectives.from_mapping({"ttft_p90_s": 2.0, "ttft_p99_s": 5.0, "tpot_p50_s": 0.1})
    assert obj.request_target_s("ttft") == 2.0 and obj.request_target_s("tpot") == 0.1
    explicit = Objectives.from_mapping({"ttft_p99_s": 5.0, "ttft_s": 3.0})
    assert explicit.request_target_s("ttft") == 3.0 and explicit.request_target_s("tpot") is None
    assert explicit.as_dict() == {"ttft_p99_s": 5.0, "ttft_s": 3.0}
    rows = [(2.5, 1.0, True, False, 10)]  # within 3 s; no TPOT target at all
    assert evaluate(table(rows), explicit, duration_s=1.0)["met_requests"] == 1
    assert evaluate(table(rows), obj, duration_s=1.0)["met_requests"] == 0


def test_fractional_percentile_names_round_trip():
    obj = Objectives.from_mapping({"ttft_p99.9_s": 8.0})
    assert obj.percentile_targets[0].percentile == 99.9
    assert obj.percentile_targets[0].name == "ttft_p99.9_s"


@pytest.mark.parametrize(("values", "needle"), [
    ({"ttft_p90": 2.0}, "objectives.ttft_p90=2.0: unknown objective"),
    ({"ttft_p90_s": -1.0}, "ttft_p90_s=-1.0 must be a positive finite"),
    ({"tpot_p0_s": 1.0}, "tpot percentile=0.0 must be a number in (0, 100]"),
    ({"ttft_p101_s": 1.0}, "ttft percentile=101.0"),
    ({"ttft_s": math.inf}, "request_ttft_s=inf"),
    ({}, "give at least one target"),
])
def test_bad_objectives_name_the_field(values, needle):
    with pytest.raises(ValueError, match=None) as err:
        Objectives.from_mapping(values)
    assert needle in str(err.value)


def test_duplicate_and_bad_metric_refused():
    t = PercentileTarget(metric="ttft", percentile=90, max_s=1.0)
    with pytest.raises(ValueError, match="ttft_p90_s given more than once"):
        Objectives(percentile_targets=(t, t))
    with pytest.raises(ValueError, match="metric='e2e' must be one of ttft, tpot"):
        PercentileTarget(metric="e2e", percentile=90, max_s=1.0)


def test_bad_tables_and_durations_refused():
    with pytest.raises(ValueError, match="requests table has no row"):
        evaluate(table([]).reindex(columns=["ttft_s", "tpot_s", "finished_s", "rejected", "output_tokens"]),
                 P90, 1.0)
    with pytest.raises(ValueError, match="lacks column\\(s\\) tpot_s"):
        evaluate(table([(1.0, 0.01, True, False, 2)]).drop(columns="tpot_s"), P90, 1.0)
    with pytest.raises(ValueError, match="duration_s=-1.0"):
        evaluate(table([(1.0, 0.01, True, False, 2)]), P90, -1.0)
    with pytest.raises(ValueError, match="duration_s=0 but 1 request"):
        evaluate(table([(1.0, 0.01, True, False, 2)]), P90, 0.0)
