"""Budgets: size the KV buffer so that memory binds (unconstrained demand, floor, suggestion)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd
from unikv.sim.analyses.jobs import Job, run_jobs
from unikv.sim.analyses.ratios import _unified_kind
from unikv.sim.analyses.rows import GIB
from unikv.sim.analyses.slices import Case, TraceSpec
from unikv.sim.models import load_model

UNBOUNDED_GIB = 128.0


def demand(pairs: Iterable[tuple[TraceSpec, str]], n_jobs: int = 1, progress=None,
           **cfg) -> pd.DataFrame:
    """What each (slice, model) holds with unlimited memory: the oracle on a
    128 GiB buffer, prefix cache off (so cached blocks do not count as demand).

    Returns one row per pair with `mean_live_bytes` (time-weighted), per-band
    means, `peak_live_bytes`, `mean_running` and the TTFT of that run.
    """
    jobs = [Job(Case(trace=t, model=m, kv_budget_gib=UNBOUNDED_GIB),
                (("layout", "oracle"), ("prefix_cache", False), *cfg.items())) for t, m in pairs]
    return run_jobs(jobs, n_jobs, progress)


def _longest(trace: TraceSpec) -> int:
    df = trace.load()
    return int((df["prompt_tokens"] + df["output_tokens"]).max())


def holds_longest(case: Case, kind: str, static_ratio=None) -> bool:
    """Whether an empty pool of this layout holds the slice's longest request
    (`sim.layouts.check_fits`: the engine's own allocation path, so no request
    of the slice is rejected at a budget where this holds)."""
    from unikv.sim.layouts import build_layout, check_fits

    config = case.config(layout=kind)
    try:
        plan = build_layout(load_model(case.model), kv_budget_gib=case.kv_budget_gib,
                            page_size=config.page_size, kind=kind, static_ratio=static_ratio)
        check_fits(plan, _longest(case.trace), compaction=config.compaction,
                   prefill_chunk_tokens=config.scheduler.prefill_tokens_per_step)
        return True
    except ValueError:  # RequestTooLargeError, or a budget too small for the bands themselves
        return False


def budget_floor_gib(trace: TraceSpec, model: str, **cfg) -> float:
    """The smallest budget (GiB, within 1 %) at which the static split at its
    default ratio and the unified layout both hold the slice's longest request."""
    def fits(gib: float) -> bool:
        case = Case(trace=trace, model=model, kv_budget_gib=gib, options=tuple(cfg.items()))
        return all(holds_longest(case, kind) for kind in ("fixed_ratio", _unified_kind(model)))

    hi = 1 / 16
    while not fits(hi):
        hi *= 2
        if hi > 1 << 14:
            raise ValueError(f"{model} cannot hold the longest request of {trace.name} in 16 TiB")
    return _edge(fits, hi, hi / 2 if hi > 1 / 16 else 1 / 1024, steps=10)


def suggest_budget_gib(mean_live_bytes: float, floor_gib: float, fraction: float = 0.6) -> float:
    """`fraction` of the unconstrained mean live bytes, at least 1.1 x the floor,
    rounded to two significant digits (GiB)."""
    gib = max(fraction * mean_live_bytes / GIB, 1.1 * floor_gib)
    scale = 10.0 ** (1 - math.floor(math.log10(gib)))
    return math.ceil(gib * scale - 1e-6) / scale  # round up: stay above the floor


def calibrate(pairs: Sequence[tuple[TraceSpec, str]], fraction: float = 0.6,
              n_jobs: int = 1, progress=None, **cfg) -> pd.DataFrame:
    """`demand(pairs)` plus each pair's budget floor and suggested budget."""
    out = demand(pairs, n_jobs, progress, **cfg)
    floors = [budget_floor_gib(t, m) for t, m in pairs]
    out["floor_gib"] = floors
    out["budget_gib"] = [suggest_budget_gib(b, f, fraction)
                         for b, f in zip(out["mean_live_bytes"], floors)]
    out["budget_fraction"] = fraction
    return out


def _edge(ok, inside: float, outside: float, steps: int = 24) -> float:
    """Bisect (in log space) for the last feasible value from `inside` toward `outside`."""
    if ok(outside):
        return outside
    for _ in range(steps):
        mid = math.sqrt(inside * outside)
        inside, outside = (mid, outside) if ok(mid) else (inside, mid)
    return inside
