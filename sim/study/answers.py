"""The planner's answers over finished runs (METRICS.md, "Service against objectives").

* `max_rate`: the highest request rate (the trace's arrivals scaled in
  time) at which every percentile target holds, by bisection on the rate
  scale to a stated relative tolerance;
* `min_budget`: the smallest KV budget at which a target rate still meets
  the objectives, by bisection on the budget;
* `goodput_curve`: goodput and attainment at each rate run;
* `unified_gain`: a unified layout's maximum rate over the best deployable
  baseline's (SGLang or vLLM rules).

Each search is a pure function of an `evaluate(x) -> row` callable (a row
is a mapping holding at least `objectives_met`, as `sim.objectives.evaluate`
gives it) and a frame of rows already finished. Points are cached by value
(12 significant digits): a point run once, or found among the finished
rows, is never run again, so a rerun, a second search over the same runs,
or the report (`known_threshold`, from the dataset alone) costs no new run.

Bisection assumes that meeting the objectives is monotone: once a rate
misses, every higher rate misses (and once a budget sustains the rate,
every larger budget does). Real runs may break it (a larger budget admits
more requests and can queue them longer); every point seen is checked and
each contradicting pair is reported (`Threshold.inversions`), and the
answer is then the conservative one: the best point that meets on the safe
side of the nearest point that misses. Midpoints are geometric (rates and
budgets span orders of magnitude); no Ray here: the study's runner passes
an evaluator that runs (or looks up) one replay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import pandas as pd

MET = "objectives_met"
MIN_REL_TOL = 1e-9
UNIFIED_LAYOUTS = ("end_end", "end_float_end")
DEPLOYABLE_BASELINES = ("sglang", "vllm")


class Outcome(str, Enum):
    """How a search ended."""

    FOUND = "found"  # the threshold lies between two points run, within the tolerance
    NONE = "none"  # the safe end of the range already misses (no rate / budget in range works)
    ALL = "all"  # the far end still meets (the answer is at least / at most that end)


class Side(Enum):
    """Where the points that meet the objectives lie: rates below the
    threshold, budgets above it."""

    BELOW = 1
    ABOVE = -1


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """The answer of one search.

    Attributes:
        outcome: see `Outcome`.
        value: the best point that meets (highest rate / smallest budget);
            None when `outcome` is NONE.
        miss: the nearest point beyond it that misses; None when ALL.
        rel_tol: the tolerance asked for; under monotonicity the threshold
            lies between `value` and `miss`, within `rel_tol` of each other
            when FOUND.
        evaluations: evaluator calls this search made (new runs).
        reused: points already known inside the range when the search
            began (which it read instead of running), plus later lookups
            answered by a known point.
        inversions: (meets, misses) pairs of points contradicting
            monotonicity (a rate that meets above one that misses, or a
            budget that meets below one that misses); empty when monotone.
        rows: every point known after the search, sorted by its value.
    """

    outcome: Outcome
    value: float | None
    miss: float | None
    rel_tol: float
    evaluations: int
    reused: int
    inversions: tuple[tuple[float, float], ...]
    rows: pd.DataFrame

    @property
    def monotone(self) -> bool:
        return not self.inversions


def _key(x: float) -> float:
    return float(f"{float(x):.12g}")


class PointCache:
    """Rows by point value: the finished rows first, then the evaluator's.

    Args:
        evaluate: point -> row (a mapping with `met_column`).
        finished: rows already run (a frame with `column` and `met_column`),
            or None.
        column: the point's column (e.g. "rate_scale", "kv_budget_gib").

    Raises:
        ValueError: a missing column, or two finished rows at one point
            that disagree on `met_column`.
    """

    def __init__(self, evaluate: Callable[[float], Mapping], finished: pd.DataFrame | None, *,
                 column: str, met_column: str = MET) -> None:
        self._evaluate, self.column, self.met_column = evaluate, column, met_column
        self._rows: dict[float, dict] = {}
        self.calls = self.hits = 0
        if finished is None:
            return
        for name in (column, met_column):
            if name not in finished.columns:
                raise ValueError(f"finished rows lack column {name!r}; expected one row per run "
                                 f"with {column!r} and {met_column!r}")
        for row in finished.to_dict("records"):
            key = _key(row[column])
            if key in self._rows and bool(self._rows[key][met_column]) != bool(row[met_column]):
                raise ValueError(f"finished rows disagree at {column}={key!r} on {met_column}; "
                                 "expected one run per point (filter the rows to one group)")
            self._rows.setdefault(key, row)

    def row(self, x: float) -> dict:
        """The row at `x`: known, or run now (and remembered)."""
        key = _key(x)
        if key in self._rows:
            self.hits += 1
            return self._rows[key]
        row = dict(self._evaluate(key))
        if self.met_column not in row:
            raise ValueError(f"evaluate({key!r}) returned a row without {self.met_column!r}")
        row.setdefault(self.column, key)
        self.calls += 1
        self._rows[key] = row
        return row

    def met(self, x: float) -> bool:
        return bool(self.row(x)[self.met_column])

    def known(self) -> dict[float, bool]:
        """Every known point -> whether it meets the objectives."""
        return {k: bool(r[self.met_column]) for k, r in sorted(self._rows.items())}

    def frame(self) -> pd.DataFrame:
        rows = [self._rows[k] for k in sorted(self._rows)]
        return pd.DataFrame(rows)


def _check_range(lo: float, hi: float, rel_tol: float, column: str) -> None:
    for name, v in (("lo", lo), ("hi", hi), ("rel_tol", rel_tol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
            raise ValueError(f"{column} search {name}={v!r} must be a positive finite number")
    if not lo < hi:
        raise ValueError(f"{column} search lo={lo!r} must be below hi={hi!r}")
    if rel_tol < MIN_REL_TOL:  # finer than the cache's keys: the bisection could not shrink
        raise ValueError(f"{column} search rel_tol={rel_tol!r} must be at least {MIN_REL_TOL:g} "
                         "(points are keyed at 12 significant digits)")


def _bracket(known: Mapping[float, bool], side: Side) -> tuple[float | None, float | None]:
    """(best point that meets, nearest point that misses beyond it) over
    `known`, on the safe side of the nearest miss (monotone or not)."""
    s = side.value  # in y = s * x the points that meet lie below the threshold
    misses = [s * x for x, ok in known.items() if not ok]
    bad_y = min(misses) if misses else math.inf
    goods = [s * x for x, ok in known.items() if ok and s * x < bad_y]
    good = s * max(goods) if goods else None
    return good, (s * bad_y if misses else None)


def inversions(known: Mapping[float, bool], side: Side) -> tuple[tuple[float, float], ...]:
    """(meets, misses) pairs of `known` that contradict monotonicity on `side`."""
    s = side.value
    good = [x for x, ok in known.items() if ok]
    bad = [x for x, ok in known.items() if not ok]
    return tuple((g, b) for g in good for b in bad if s * g > s * b)


def _result(cache: PointCache, outcome: Outcome, side: Side, rel_tol: float, span: tuple[float, float],
            calls_before: int = 0, hits_before: int = 0, known_before: int = 0) -> Threshold:
    """The search's answer from the points known inside `span` (inversions over all of them)."""
    known = cache.known()
    value, miss = _bracket({x: ok for x, ok in known.items() if span[0] <= x <= span[1]}, side)
    return Threshold(outcome=outcome, value=None if outcome is Outcome.NONE else value, miss=miss,
                     rel_tol=rel_tol, evaluations=cache.calls - calls_before,
                     reused=cache.hits - hits_before + known_before, inversions=inversions(known, side),
                     rows=cache.frame())


def _inside(cache: PointCache, lo: float, hi: float) -> dict[float, bool]:
    return {x: ok for x, ok in cache.known().items() if lo <= x <= hi}


def search(cache: PointCache, *, lo: float, hi: float, rel_tol: float, side: Side) -> Threshold:
    """Bisect `[lo, hi]` for the threshold between points that meet the
    objectives and points that miss them (see the module docstring).

    Raises:
        ValueError: a bad range or tolerance; what the evaluator raises.
    """
    _check_range(lo, hi, rel_tol, cache.column)
    lo, hi = _key(lo), _key(hi)  # the cache's keys: a point at an end counts as inside
    calls, hits = cache.calls, cache.hits
    safe, far = (lo, hi) if side is Side.BELOW else (hi, lo)
    inside = _inside(cache, lo, hi)
    was = (calls, hits, len(inside))
    good, bad = _bracket(inside, side)
    # An end is run only when the points known inside the range leave that
    # side open: a known meeting point already says the safe end meets (and a
    # known miss that the far end misses), under monotonicity.
    if good is None and not cache.met(safe):
        return _result(cache, Outcome.NONE, side, rel_tol, (lo, hi), *was)
    if bad is None and cache.met(far):
        return _result(cache, Outcome.ALL, side, rel_tol, (lo, hi), *was)
    good, bad = _bracket(_inside(cache, lo, hi), side)
    while good is not None and bad is not None and max(good, bad) > min(good, bad) * (1 + rel_tol):
        mid = math.sqrt(good * bad)
        if cache.met(mid):
            good = mid
        else:
            bad = mid
    return _result(cache, Outcome.FOUND, side, rel_tol, (lo, hi), *was)


def max_rate(evaluate: Callable[[float], Mapping], finished: pd.DataFrame | None = None, *,
             lo: float, hi: float, rel_tol: float = 0.05, column: str = "rate_scale",
             met_column: str = MET) -> Threshold:
    """The highest rate scale in `[lo, hi]` that meets the objectives, to
    `rel_tol` (relative). `evaluate(rate)` runs one replay at that scale."""
    cache = PointCache(evaluate, finished, column=column, met_column=met_column)
    return search(cache, lo=lo, hi=hi, rel_tol=rel_tol, side=Side.BELOW)


def min_budget(evaluate: Callable[[float], Mapping], finished: pd.DataFrame | None = None, *,
               lo: float, hi: float, rel_tol: float = 0.05, column: str = "kv_budget_gib",
               met_column: str = MET) -> Threshold:
    """The smallest KV budget in `[lo, hi]` at which the target rate meets
    the objectives, to `rel_tol`. `evaluate(budget)` runs the target rate
    at that budget."""
    cache = PointCache(evaluate, finished, column=column, met_column=met_column)
    return search(cache, lo=lo, hi=hi, rel_tol=rel_tol, side=Side.ABOVE)


def known_threshold(rows: pd.DataFrame, *, column: str, side: Side = Side.BELOW,
                    met_column: str = MET) -> Threshold:
    """The answer the finished `rows` alone give (no run): the range is the
    points present, `rel_tol` the gap left between `value` and `miss`
    (NaN unless FOUND).

    Raises:
        ValueError: no row, or a missing column.
    """
    if rows.empty:
        raise ValueError(f"no finished row to read a {column} threshold from")

    def refuse(x: float) -> Mapping:
        raise AssertionError(f"known_threshold ran nothing, yet {column}={x!r} was asked")

    cache = PointCache(refuse, rows, column=column, met_column=met_column)
    known = cache.known()
    lo, hi = min(known), max(known)
    safe, far = (lo, hi) if side is Side.BELOW else (hi, lo)
    outcome = (Outcome.NONE if not known[safe] else Outcome.ALL if known[far] else Outcome.FOUND)
    value, miss = _bracket(known, side)
    gap = max(value, miss) / min(value, miss) - 1 if outcome is Outcome.FOUND and value and miss else math.nan
    return Threshold(outcome=outcome, value=None if outcome is Outcome.NONE else value, miss=miss,
                     rel_tol=gap, evaluations=0, reused=len(rows), inversions=inversions(known, side),
                     rows=cache.frame())


def goodput_curve(rows: pd.DataFrame, *, column: str = "rate_scale") -> pd.DataFrame:
    """Goodput, attainment and whether the objectives hold at each rate run,
    sorted by rate (the columns `sim.objectives.evaluate` adds)."""
    keep = [column, "goodput_rps", "objective_attainment", MET]
    missing = [c for c in keep if c not in rows.columns]
    if missing:
        raise ValueError(f"rows lack column(s) {', '.join(missing)}; expected sim.objectives.evaluate's")
    return rows[keep].sort_values(column, kind="stable").reset_index(drop=True)


def rate_bounds(t: Threshold) -> tuple[float, float]:
    """Where the true maximum rate lies (under monotonicity): FOUND
    [value, miss), ALL [value, inf), NONE (0, miss)."""
    if t.outcome is Outcome.NONE:
        return 0.0, float(t.miss) if t.miss is not None else math.inf
    return float(t.value or 0.0), float(t.miss) if t.miss is not None else math.inf


def unified_gain(maxima: Mapping[str, Threshold], *, unified: Iterable[str] = UNIFIED_LAYOUTS,
                 baselines: Iterable[str] = DEPLOYABLE_BASELINES) -> pd.DataFrame:
    """Per unified layout in `maxima`: its maximum rate over the best
    deployable baseline's (the baseline whose maximum rate is highest).

    Returns one row per unified layout present: `layout`, `max_rate`,
    `baseline`, `baseline_max_rate`, `gain` (value / value; NaN unless both
    searches FOUND a threshold) and `gain_low` / `gain_high`, the range the
    gain lies in given each rate's bounds (`rate_bounds`). Empty when no
    baseline or no unified layout is present.
    """
    present = [b for b in baselines if b in maxima]
    if not present:
        return pd.DataFrame(columns=["layout", "max_rate", "baseline", "baseline_max_rate", "gain",
                                     "gain_low", "gain_high"])
    best = max(present, key=lambda b: rate_bounds(maxima[b]))
    b_lo, b_hi = rate_bounds(maxima[best])
    rows = []
    for layout in (u for u in unified if u in maxima):
        t, base = maxima[layout], maxima[best]
        u_lo, u_hi = rate_bounds(t)
        both = t.outcome is Outcome.FOUND and base.outcome is Outcome.FOUND
        rows.append({"layout": layout, "max_rate": t.value, "baseline": best,
                     "baseline_max_rate": base.value,
                     "gain": t.value / base.value if both and base.value else math.nan,
                     "gain_low": _div(u_lo, b_hi), "gain_high": _div(u_hi, b_lo)})
    return pd.DataFrame(rows)


def _div(a: float, b: float) -> float:
    if b == 0:
        return math.inf if a > 0 else math.nan
    return a / b if not (math.isinf(a) and math.isinf(b)) else math.nan
