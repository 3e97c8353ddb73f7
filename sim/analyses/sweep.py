"""Layouts compared: the oracle, the static split (default and a swept ratio), the unified pool."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from unikv.sim.analyses.budgets import _edge, holds_longest
from unikv.sim.analyses.jobs import Job, run_jobs
from unikv.sim.analyses.ratios import Ratio, _default_ratio, _static_change, _unified_kind, matched_ratio
from unikv.sim.analyses.slices import Case
from unikv.sim.analyses.views import _with_efficiency, headline, sweep_view

SWEEP_FACTORS = (0.7, 1.0, 1.4)
"""Static ratios swept: these multiples of the ratio the oracle's own mix gives."""


SWEEP_STEP = 1.4
"""The sweep extends past an end by this factor while its best ratio sits there."""


SWEEP_EXTEND = 4
"""At most this many extension rounds."""


SWEEP_REFINE = 2
"""Then this many rounds of geometric midpoints next to the best ratio."""


def layout_runs(cases: Sequence[Case], *, sweep: Sequence[float] = SWEEP_FACTORS,
                extend: int = SWEEP_EXTEND, refine: int = SWEEP_REFINE,
                compactions: Sequence[str] = ("lazy", "eager"),
                n_jobs: int = 1, progress=None) -> pd.DataFrame:
    """Every run of a layout comparison, one row each (long format).

    Per case: the oracle; the static split at SGLang's default ratio; the
    static split at `sweep` multiples of the ratio matched to the oracle's mix
    of live bytes (kept inside the ratios whose regions hold the slice's
    longest request), extended by one `SWEEP_STEP` at a time (at most `extend`
    rounds) while the best static ratio (default included) is at an end, then
    `refine` rounds of geometric midpoints next to the best; the unified
    layout (end_end, or end_float_end on a three-kind model) in each of
    `compactions`. Column `role` says which, `sweep_factor` the multiple of
    the matched ratio; `capacity_efficiency` / `throughput_efficiency` are
    against the case's oracle run. A run that cannot start gives a row with
    `error` set and no numbers.
    """
    oracle = run_jobs([Job(c, (("layout", "oracle"),), (("role", "oracle"),)) for c in cases],
                      n_jobs, progress)
    matched = [matched_ratio(c.model, row) for c, (_, row) in zip(cases, oracle.iterrows())]
    bounds = [feasible_factors(c, r) if r is not None else None for c, r in zip(cases, matched)]
    jobs = []
    for case, ratio, fb in zip(cases, matched, bounds):
        default = _default_ratio(case.model)
        at = _default_factor(default, ratio)
        jobs.append(Job(case, (("layout", "fixed_ratio"), *_static_change(default)),
                        (("role", "static_default"), ("sweep_factor", at))))
        if ratio is not None:
            jobs.extend(_sweep_job(case, ratio, f) for f in _spread(sweep, fb) if f != at)
        jobs.extend(Job(case, (("layout", _unified_kind(case.model)), ("compaction", c)),
                        (("role", "unified"),)) for c in compactions)
    runs = pd.concat([oracle, run_jobs(jobs, n_jobs, progress)], ignore_index=True)
    for step in [_extension] * extend + [_refinement] * refine:
        more = [_sweep_job(case, ratio, f) for case, ratio, fb in zip(cases, matched, bounds)
                if ratio is not None for f in step(_static_points(runs, case), fb)]
        if more:
            runs = pd.concat([runs, run_jobs(more, n_jobs, progress)], ignore_index=True)
    return _with_efficiency(runs)


def _default_factor(default: Ratio | None, matched: Ratio | None) -> float:
    """The default ratio as a multiple of the matched one (one-ratio models)."""
    if default is None or matched is None or len(matched.bands) != 1:
        return math.nan
    if matched.bands == ("swa",):
        return round(default.swa_full_tokens / matched.swa_full_tokens, 6)
    return round(default.mamba_full_memory / matched.mamba_full_memory, 6)


def feasible_factors(case: Case, ratio: Ratio) -> tuple[float, float] | None:
    """The interval of multiples of `ratio` whose static split holds the slice's
    longest request (`holds_longest`), found by bisection around the default
    ratio; None when the default itself does not hold it or the model has
    more than one ratio."""
    if len(ratio.bands) != 1:
        return None
    value = (lambda r: r.swa_full_tokens) if ratio.bands == ("swa",) else (lambda r: r.mamba_full_memory)

    def ok(f: float) -> bool:
        return holds_longest(case, "fixed_ratio", ratio.scaled(f).as_static_ratio())

    ref = value(Ratio(bands=ratio.bands)) / value(ratio)
    if not ok(ref):
        return None
    return _edge(ok, ref, ref / 1e3), _edge(ok, ref, ref * 1e3)


def _spread(factors: Sequence[float], bounds: tuple[float, float] | None) -> list[float]:
    """`factors` clamped into `bounds`; when clamping merges points, add points
    SWEEP_STEP apart inward from the clamped end, so the sweep keeps its size."""
    out = sorted({_clamp(f, bounds) for f in factors})
    if bounds is None or len(out) >= len(factors):
        return out
    lo, hi = bounds
    step = SWEEP_STEP if out[0] == _clamp(lo, bounds) else 1 / SWEEP_STEP
    f = out[0] if step > 1 else out[-1]
    while len(out) < len(factors):
        f = _clamp(f * step, bounds)
        if f in out:
            break
        out = sorted({*out, f})
    return out


def _clamp(factor: float, bounds: tuple[float, float] | None) -> float:
    if bounds is not None:
        factor = min(max(factor, bounds[0]), bounds[1])
    return round(factor, 6)


def _sweep_job(case: Case, ratio: Ratio, factor: float) -> Job:
    return Job(case, (("layout", "fixed_ratio"), ("static_ratio", ratio.scaled(factor))),
               (("role", "static_sweep"), ("sweep_factor", round(factor, 6))))


def _static_points(runs: pd.DataFrame, case: Case) -> pd.DataFrame:
    """The case's static runs on the sweep's axis (default included), by factor."""
    mine = runs[runs["role"].isin(["static_default", "static_sweep"]) & runs["sweep_factor"].notna()
                & (runs["trace"] == case.trace.name) & (runs["model"] == case.model)
                & (runs["kv_budget_gib"] == case.kv_budget_gib)]
    return mine.sort_values("sweep_factor")


def _best_factor(points: pd.DataFrame) -> float | None:
    ok = points[points["error"].isna()]
    if ok.empty:
        return None
    ok = ok[ok["rejected"] == ok["rejected"].min()]
    return ok.sort_values(["mean_running", "ttft_p90_s"], ascending=[False, True]).iloc[0]["sweep_factor"]


def _extension(points: pd.DataFrame, bounds) -> list[float]:
    """The next factor past the end where the best static ratio sits (clamped
    to the feasible interval; none if already run)."""
    best = _best_factor(points)
    factors = list(points["sweep_factor"])
    if best is None or min(factors) < best < max(factors):
        return []
    new = _clamp(best / SWEEP_STEP if best == min(factors) else best * SWEEP_STEP, bounds)
    return [] if new in factors else [new]


def _refinement(points: pd.DataFrame, bounds) -> list[float]:
    """Geometric midpoints between the best factor and its neighbours."""
    best = _best_factor(points)
    if best is None:
        return []
    factors = sorted(set(points["sweep_factor"]))
    i = factors.index(best)
    near = [factors[j] for j in (i - 1, i + 1) if 0 <= j < len(factors)]
    mids = {_clamp(math.sqrt(best * f), bounds) for f in near if max(best, f) / min(best, f) > 1.1}
    return sorted(mids - set(factors))


def layout_comparison(cases: Sequence[Case], *, sweep: Sequence[float] = SWEEP_FACTORS,
                      compactions: Sequence[str] = ("lazy",), n_jobs: int = 1) -> pd.DataFrame:
    """The headline comparison of `cases` (see `headline`, `layout_runs`)."""
    return headline(layout_runs(cases, sweep=sweep, compactions=compactions, n_jobs=n_jobs))


def static_ratio_sweep(cases: Sequence[Case], *, sweep: Sequence[float] = SWEEP_FACTORS,
                       n_jobs: int = 1) -> pd.DataFrame:
    """Static split at the default ratio and at `sweep` multiples of the
    oracle-matched ratio, per case, with capacity efficiency vs the oracle."""
    return sweep_view(layout_runs(cases, sweep=sweep, compactions=(), n_jobs=n_jobs))
