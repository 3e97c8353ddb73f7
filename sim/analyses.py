"""Analyses over many runs: capacity over time, eager vs lazy, layouts compared.

The notebooks under `notebooks/` and `python -m sim.results_cmd` call these
functions and only plot what they return. A `TraceSpec` names one slice of a
real trace (window, rate scale, Poisson rate for length-only traces, context
clip); a `Case` is a trace slice x model x KV budget. Every table row carries
its case (trace label, model, budget) and its run's parameters, so a row can
be reproduced with `run_case(case, layout=..., ...)`.

Runs go through `sim.run.run` (one torch thread each). `n_jobs > 1` spreads the
runs of one table over worker processes (spawned, so a parent that already
used torch is safe); results do not depend on `n_jobs`.
"""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

import traces
from sim.config import RunConfig
from sim.layouts import (DEFAULT_MAMBA_FULL_MEMORY_RATIO, DEFAULT_SWA_FULL_TOKENS_RATIO,
                         applicable_kinds)
from sim.models import load_model
from sim.run import RunResult, run

GIB = float(1 << 30)


# -- what one run replays ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TraceSpec:
    """One slice of a trace, as the analyses replay it.

    The transforms apply in this order: load (Poisson arrivals at `rate_rps`
    for length-only traces; Mooncake buckets spread over `spread_s`), keep
    `[start_s, end_s)`, clip each request to `max_context_tokens` (prompt
    first, `traces.clip_to_context(mode="truncate")`), replay `rate_scale`
    times faster, keep the first `max_requests`.

    Attributes:
        name: a label; also the bundled sample loaded when `source` is None.
        source: a bundled sample name or a trace file path (None: `name`).
        start_s, end_s: the time window, seconds of the (loaded) trace.
        rate_scale: replay this many times faster (> 1) or slower.
        rate_rps: Poisson arrival rate for traces without timestamps.
        spread_s: spread equal timestamps over this many seconds (Mooncake: 3).
        max_context_tokens: clip prompt + output to this many tokens.
        max_requests: keep the first N requests of the slice.
        seed: seed of the Poisson spacing and the spread.
        prefix_cache: reuse cached prompt blocks (traces with prefix hashes).
    """

    name: str
    source: Optional[str] = None
    start_s: float = 0.0
    end_s: Optional[float] = 120.0
    rate_scale: float = 1.0
    rate_rps: Optional[float] = None
    spread_s: Optional[float] = None
    max_context_tokens: Optional[int] = None
    max_requests: Optional[int] = None
    seed: int = 0
    prefix_cache: bool = True

    @property
    def path(self) -> str:
        return self.source or self.name

    def with_source(self, traces_dir: Optional[Path]) -> "TraceSpec":
        """The same slice read from the full upstream file in `traces_dir`
        (the bundled samples are byte-exact prefixes of those files)."""
        if traces_dir is None or self.path not in traces.samples.names():
            return self
        upstream = Path(traces_dir) / traces.samples.info(self.path)["source"]["file"]
        if not upstream.is_file():
            raise FileNotFoundError(f"{upstream} not found (the full file of sample {self.path!r})")
        return replace(self, source=str(upstream))

    def load(self) -> pd.DataFrame:
        """The slice as a trace frame (cached per spec; do not mutate it)."""
        return _load_trace(self)

    def describe(self) -> dict:
        """The spec's fields plus the loaded slice's size and transform history."""
        df = self.load()
        return {**asdict(self), "requests": len(df), "history": list(df.attrs.get("history", ())),
                "file": str(df.attrs.get("source", self.path))}

    def run_fields(self) -> dict:
        """RunConfig fields that name this slice (recorded in each run's identity)."""
        return {"trace": self.path, "trace_start_s": self.start_s, "trace_end_s": self.end_s,
                "rate_scale": self.rate_scale, "max_requests": self.max_requests, "seed": self.seed}


@lru_cache(maxsize=32)
def _load_trace(spec: TraceSpec) -> pd.DataFrame:
    opts = {"rate_rps": spec.rate_rps, "spread_s": spec.spread_s, "seed": spec.seed}
    opts = {k: v for k, v in opts.items() if v is not None}
    if spec.path in traces.samples.names():
        df = traces.load_sample(spec.path, **opts)
    else:
        df = traces.load(spec.path, **opts)
    df = traces.window(df, start_s=spec.start_s, end_s=spec.end_s)
    if spec.max_context_tokens is not None:
        df = traces.clip_to_context(df, max_context_tokens=spec.max_context_tokens)
    if spec.rate_scale != 1.0:
        df = traces.scale_rate(df, factor=spec.rate_scale)
    if spec.max_requests is not None:
        df = df.iloc[: spec.max_requests]
    if df.empty:
        raise ValueError(f"trace slice {spec} holds no request")
    return df


@dataclass(frozen=True, kw_only=True)
class Case:
    """A trace slice x model x KV budget: what every layout of a comparison shares.

    Attributes:
        trace: the slice.
        model: a bundled model name or a config.json path.
        kv_budget_gib: the KV buffer, GiB.
        options: other RunConfig / SchedulerConfig fields, as (name, value) pairs.
    """

    trace: TraceSpec
    model: str
    kv_budget_gib: float
    options: tuple = ()

    def config(self, **changes) -> RunConfig:
        """The RunConfig of this case with `changes` (flat scheduler fields allowed)."""
        base = RunConfig(**self.trace.run_fields(), model=self.model,
                         kv_budget_gib=self.kv_budget_gib, oversize="reject")
        return base.with_(**{"prefix_cache": self.trace.prefix_cache, **dict(self.options), **changes})

    def labels(self) -> dict:
        return {"trace": self.trace.name, "model": self.model, "kv_budget_gib": self.kv_budget_gib}


def run_case(case: Case, **changes) -> RunResult:
    """Run one layout of `case` (`changes`: layout, compaction, static_ratio, ...)."""
    return run(case.config(**changes), trace_df=case.trace.load())


def capacity_over_time(trace: TraceSpec | str, model: str, kv_budget_gib: float,
                       layout: str = "end_end", compaction: str = "lazy", **cfg) -> RunResult:
    """One run with its per-step table (capacity, bytes per band, frontiers).

    Args:
        trace: a TraceSpec, or a bundled sample name (its first 120 s).
        cfg: other RunConfig / SchedulerConfig fields.
    """
    spec = trace if isinstance(trace, TraceSpec) else TraceSpec(name=trace)
    case = Case(trace=spec, model=model, kv_budget_gib=kv_budget_gib)
    return run_case(case, layout=layout, compaction=compaction, **cfg)


# -- one run -> one row --------------------------------------------------------------------

SUMMARY_KEYS = ("arrived", "admitted", "finished", "rejected", "retractions", "admission_rate",
                "steps", "sim_time_s", "busy_time_s", "mean_running", "throughput_tok_s",
                "queue_delay_p90_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
                "prefix_hit_ratio",
                "mean_available_tokens", "mean_hole_ratio", "mean_unusable_free_ratio",
                "moves", "moved_bytes", "flushes", "urgent_flushes", "relocations",
                "move_time_s", "compaction_overhead")


def step_extras(steps: pd.DataFrame) -> dict:
    """Per-step numbers the run summary lacks (defined in docs/results.md).

    stall_time_frac: share of simulated time spent in admission stalls:
    steps that begin with requests waiting (the previous step ended with
    some) and admit none; step_overhead_p99 / _max: the 99th
    percentile and the maximum of the per-step compaction overhead;
    mean_step_time_ms.
    """
    if steps.empty:
        return dict.fromkeys(("stall_time_frac", "step_overhead_p99", "step_overhead_max",
                              "mean_step_time_ms"), math.nan)
    admitted = steps["admitted"].diff().fillna(steps["admitted"].iloc[0])
    stalled = (steps["waiting"].shift(1, fill_value=0) > 0) & (admitted == 0)
    dt = steps["step_time_s"]
    return {"stall_time_frac": float(dt[stalled].sum() / dt.sum()),
            "step_overhead_p99": float(steps["compaction_overhead"].quantile(0.99)),
            "step_overhead_max": float(steps["compaction_overhead"].max()),
            "mean_step_time_ms": float(1e3 * dt.mean())}


def band_demand(steps: pd.DataFrame) -> dict:
    """Time-weighted mean live bytes per band (`<band>_mean_live_bytes`), of all
    bands (`mean_live_bytes`), and the peak of all live bytes."""
    dt = steps["step_time_s"]
    total = float(dt.sum()) or 1.0
    bands = [c for c in steps.columns if c.endswith("live_bytes")]
    out = {f"{c[:-len('live_bytes')]}mean_live_bytes": float((steps[c] * dt).sum() / total)
           for c in bands}
    out["peak_live_bytes"] = float(steps["live_bytes"].max()) if len(steps) else 0.0
    return out


def result_row(result: RunResult) -> dict:
    """The summary numbers of one run, its step extras and band demand."""
    s = result.summary
    row = {k: s.get(k) for k in SUMMARY_KEYS}
    row.update(step_extras(result.steps))
    row.update(band_demand(result.steps))
    # All bytes moved over the run, charged at the cost model's move bandwidth:
    # the engine's per-step move_time_s misses moves made while freeing (eager).
    row["move_time_all_s"] = 2 * row["moved_bytes"] / _move_bytes_per_s()
    busy = s.get("busy_time_s") or math.nan
    row["compaction_overhead_all"] = row["move_time_all_s"] / busy
    row.update(wall_s=result.wall_s, violations=len(result.violations),
               git_revision=result.identity["git_revision"])
    return row


@lru_cache(maxsize=1)
def _move_bytes_per_s() -> float:
    from sim import cost

    results = Path(__file__).resolve().parents[1] / "results" / "kernels"
    return cost.HardwareSpec.from_results(results).move_bytes_per_s


@dataclass(frozen=True)
class Job:
    """One run of a table: its case, its RunConfig changes, its extra row labels."""

    case: Case
    changes: tuple
    labels: tuple = ()


def _run_job(job: Job) -> dict:
    changes = dict(job.changes)
    ratio = changes.get("static_ratio")
    shown = {k: v for k, v in changes.items() if k != "static_ratio"}
    labels = {**job.case.labels(), "rate_scale": job.case.trace.rate_scale, **shown,
              **_ratio_columns(ratio), **dict(job.labels)}
    if ratio is not None:
        changes["static_ratio"] = ratio.as_static_ratio()
    try:
        result = run_case(job.case, **changes)
    except ValueError as exc:  # e.g. a static region too small for the trace's longest request
        return {**labels, "error": str(exc)}
    return {**labels, "error": None, **result_row(result)}


def run_jobs(jobs: Sequence[Job], n_jobs: int = 1, progress=None) -> pd.DataFrame:
    """Run `jobs`, in `n_jobs` worker processes when > 1; one row each, in order.

    progress: called with each finished row (a dict), or None.
    """
    report = progress or (lambda row: None)
    if n_jobs <= 1 or len(jobs) <= 1:
        rows = []
        for job in jobs:
            rows.append(_run_job(job))
            report(rows[-1])
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(n_jobs, len(jobs)), mp_context=ctx) as ex:
            futures = [ex.submit(_run_job, j) for j in jobs]
            for f in as_completed(futures):
                report(f.result())
            rows = [f.result() for f in futures]
    return pd.DataFrame(rows)


# -- budgets: size the buffer so that memory binds ----------------------------------------

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
    from sim.layouts import build_layout, check_fits

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
        return all(holds_longest(case, kind) for kind in ("static", _unified_kind(model)))

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


# -- layouts compared ----------------------------------------------------------------------

SWEEP_FACTORS = (0.7, 1.0, 1.4)
"""Static ratios swept: these multiples of the ratio the oracle's own mix gives."""
SWEEP_STEP = 1.4
"""The sweep extends past an end by this factor while its best ratio sits there."""
SWEEP_EXTEND = 4
"""At most this many extension rounds."""
SWEEP_REFINE = 2
"""Then this many rounds of geometric midpoints next to the best ratio."""


def _ratio_columns(ratio) -> dict:
    if ratio is None:
        return {}
    return {"static_swa_full_tokens": ratio.swa_full_tokens if "swa" in ratio.bands else math.nan,
            "static_mamba_full_memory": ratio.mamba_full_memory if "mamba" in ratio.bands else math.nan}


@dataclass(frozen=True)
class Ratio:
    """A static split ratio over the bands a model splits with "full" (`bands`:
    "swa" and/or "mamba"); the fields default to SGLang's start-up ratios."""

    bands: tuple
    swa_full_tokens: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_full_memory: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO

    def scaled(self, factor: float) -> "Ratio":
        return replace(self, swa_full_tokens=self.swa_full_tokens * factor,
                       mamba_full_memory=self.mamba_full_memory * factor)

    def as_static_ratio(self):
        from sim.layouts import StaticRatio

        return StaticRatio(swa_full_tokens=self.swa_full_tokens,
                           mamba_full_memory=self.mamba_full_memory)


def matched_ratio(model: str, oracle_row: dict | pd.Series) -> Optional[Ratio]:
    """The static ratio that matches the oracle's time-mean mix of live bytes
    (swa tokens / full tokens; mamba bytes / full bytes), or None for a
    one-band model."""
    spec = load_model(model)
    split = tuple(k for k in spec.kinds if k != "full")
    if not split or "full" not in spec.kinds:
        return None
    full = oracle_row["full_mean_live_bytes"]
    if not full > 0:
        return None
    out = Ratio(bands=split)
    if "swa" in split:
        swa_tokens = oracle_row["swa_mean_live_bytes"] / spec.swa_token_bytes
        out = replace(out, swa_full_tokens=swa_tokens / (full / spec.full_token_bytes))
    if "mamba" in split:
        out = replace(out, mamba_full_memory=oracle_row["mamba_mean_live_bytes"] / full)
    return out if out.swa_full_tokens > 0 and out.mamba_full_memory > 0 else None


def _static_change(ratio: Optional[Ratio]) -> tuple:
    return () if ratio is None else (("static_ratio", ratio),)


def _unified_kind(model: str) -> str:
    return [k for k in applicable_kinds(load_model(model)) if k not in ("static", "oracle")][0]


def _default_ratio(model: str) -> Optional[Ratio]:
    kinds = load_model(model).kinds
    split = tuple(k for k in kinds if k != "full")
    return Ratio(bands=split) if split and "full" in kinds else None


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
        jobs.append(Job(case, (("layout", "static"), *_static_change(default)),
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


def _default_factor(default: Optional[Ratio], matched: Optional[Ratio]) -> float:
    """The default ratio as a multiple of the matched one (one-ratio models)."""
    if default is None or matched is None or len(matched.bands) != 1:
        return math.nan
    if matched.bands == ("swa",):
        return round(default.swa_full_tokens / matched.swa_full_tokens, 6)
    return round(default.mamba_full_memory / matched.mamba_full_memory, 6)


def feasible_factors(case: Case, ratio: Ratio) -> Optional[tuple[float, float]]:
    """The interval of multiples of `ratio` whose static split holds the slice's
    longest request (`holds_longest`), found by bisection around the default
    ratio; None when the default itself does not hold it or the model has
    more than one ratio."""
    if len(ratio.bands) != 1:
        return None
    value = (lambda r: r.swa_full_tokens) if ratio.bands == ("swa",) else (lambda r: r.mamba_full_memory)

    def ok(f: float) -> bool:
        return holds_longest(case, "static", ratio.scaled(f).as_static_ratio())

    ref = value(Ratio(bands=ratio.bands)) / value(ratio)
    if not ok(ref):
        return None
    return _edge(ok, ref, ref / 1e3), _edge(ok, ref, ref * 1e3)


def _edge(ok, inside: float, outside: float, steps: int = 24) -> float:
    """Bisect (in log space) for the last feasible value from `inside` toward `outside`."""
    if ok(outside):
        return outside
    for _ in range(steps):
        mid = math.sqrt(inside * outside)
        inside, outside = (mid, outside) if ok(mid) else (inside, mid)
    return inside


def _spread(factors: Sequence[float], bounds: Optional[tuple[float, float]]) -> list[float]:
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


def _clamp(factor: float, bounds: Optional[tuple[float, float]]) -> float:
    if bounds is not None:
        factor = min(max(factor, bounds[0]), bounds[1])
    return round(factor, 6)


def _sweep_job(case: Case, ratio: Ratio, factor: float) -> Job:
    return Job(case, (("layout", "static"), ("static_ratio", ratio.scaled(factor))),
               (("role", "static_sweep"), ("sweep_factor", round(factor, 6))))


def _static_points(runs: pd.DataFrame, case: Case) -> pd.DataFrame:
    """The case's static runs on the sweep's axis (default included), by factor."""
    mine = runs[runs["role"].isin(["static_default", "static_sweep"]) & runs["sweep_factor"].notna()
                & (runs["trace"] == case.trace.name) & (runs["model"] == case.model)
                & (runs["kv_budget_gib"] == case.kv_budget_gib)]
    return mine.sort_values("sweep_factor")


def _best_factor(points: pd.DataFrame) -> Optional[float]:
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


CASE_KEYS = ["trace", "model", "kv_budget_gib", "rate_scale"]


def _with_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    oracle = runs[runs["role"] == "oracle"].set_index(CASE_KEYS)
    key = pd.MultiIndex.from_frame(runs[CASE_KEYS])
    for col, base in (("capacity_efficiency", "mean_running"), ("throughput_efficiency", "throughput_tok_s")):
        runs[col] = runs[base].to_numpy() / oracle[base].reindex(key).to_numpy()
    runs["layout"] = runs["layout"].fillna("static")
    runs["compaction"] = runs.get("compaction", pd.Series(index=runs.index, dtype=object)).where(
        runs["layout"].isin(["end_end", "end_float_end"]))
    return runs


def best_static(runs: pd.DataFrame) -> pd.DataFrame:
    """Per case, the static run (default or swept) that holds the most running
    requests among those that reject the fewest; ties: lowest TTFT p90."""
    static = runs[runs["role"].isin(["static_default", "static_sweep"]) & runs["error"].isna()]
    fewest = static.groupby(CASE_KEYS)["rejected"].transform("min")
    static = static[static["rejected"] == fewest]
    order = static.sort_values(["mean_running", "ttft_p90_s"], ascending=[False, True])
    return order.groupby(CASE_KEYS, sort=False).head(1)


HEADLINE_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "label", "layout", "compaction",
                    "static_swa_full_tokens", "static_mamba_full_memory", "capacity_efficiency",
                    "throughput_efficiency", "mean_running", "throughput_tok_s", "admission_rate",
                    "ttft_p50_s", "ttft_p90_s", "retractions", "rejected", "stall_time_frac",
                    "mean_unusable_free_ratio", "moves", "compaction_overhead"]


def headline(runs: pd.DataFrame) -> pd.DataFrame:
    """Per case: oracle, static at the default ratio, static at the best ratio
    of the sweep, and the unified layout in each compaction mode."""
    best = best_static(runs).assign(label="static (best of sweep)")
    parts = [runs[runs["role"] == "oracle"].assign(label="oracle"),
             runs[runs["role"] == "static_default"].assign(label="static (default)"), best,
             runs[runs["role"] == "unified"].pipe(
                 lambda d: d.assign(label=d["layout"] + "/" + d["compaction"]))]
    out = pd.concat(parts, ignore_index=True)
    cases = runs[CASE_KEYS].drop_duplicates().reset_index(drop=True).reset_index(names="_case")
    out = out.merge(cases, on=CASE_KEYS, how="left")
    out["_label"] = out["label"].map({"static (default)": 0, "static (best of sweep)": 1,
                                      "oracle": 9}).fillna(5)
    out = out.sort_values(["_case", "_label", "label"], kind="stable")
    return out[[c for c in HEADLINE_COLUMNS if c in out.columns]].reset_index(drop=True)


def layout_comparison(cases: Sequence[Case], *, sweep: Sequence[float] = SWEEP_FACTORS,
                      compactions: Sequence[str] = ("lazy",), n_jobs: int = 1) -> pd.DataFrame:
    """The headline comparison of `cases` (see `headline`, `layout_runs`)."""
    return headline(layout_runs(cases, sweep=sweep, compactions=compactions, n_jobs=n_jobs))


SWEEP_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "role", "sweep_factor",
                 "static_swa_full_tokens", "static_mamba_full_memory", "error", "capacity_efficiency",
                 "throughput_efficiency", "mean_running", "ttft_p90_s", "rejected", "retractions",
                 "mean_unusable_free_ratio"]


def sweep_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The static runs of `layout_runs` (default ratio and sweep), best marked."""
    static = runs[runs["role"].isin(["static_default", "static_sweep"])].copy()
    static["best"] = static.index.isin(best_static(runs).index)
    return static[[c for c in SWEEP_COLUMNS if c in static.columns] + ["best"]].reset_index(drop=True)


def static_ratio_sweep(cases: Sequence[Case], *, sweep: Sequence[float] = SWEEP_FACTORS,
                       n_jobs: int = 1) -> pd.DataFrame:
    """Static split at the default ratio and at `sweep` multiples of the
    oracle-matched ratio, per case, with capacity efficiency vs the oracle."""
    return sweep_view(layout_runs(cases, sweep=sweep, compactions=(), n_jobs=n_jobs))


# -- eager vs lazy -------------------------------------------------------------------------

EAGER_LAZY_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "layout", "compaction",
                      "moves", "moved_gib", "move_time_all_s", "compaction_overhead_all",
                      "move_time_s", "compaction_overhead", "step_overhead_p99",
                      "step_overhead_max", "flushes", "urgent_flushes", "relocations",
                      "mean_step_time_ms", "admission_rate", "mean_running", "throughput_tok_s",
                      "ttft_p90_s", "retractions", "stall_time_frac"]


def eager_lazy_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The unified runs of a table of runs, one row per case x compaction mode."""
    out = runs[runs["layout"].isin(["end_end", "end_float_end"])].copy()
    out["moved_gib"] = out["moved_bytes"] / GIB
    return out[[c for c in EAGER_LAZY_COLUMNS if c in out.columns]].reset_index(drop=True)


def eager_vs_lazy(cases: Sequence[Case], *, n_jobs: int = 1) -> pd.DataFrame:
    """Compaction cost and admission of the unified layout, eager vs lazy, per case
    (cases of a one-band model included: their single END band still compacts)."""
    jobs = []
    for case in cases:
        jobs.extend(Job(case, (("layout", _unified_kind(case.model)), ("compaction", c)),
                        (("role", "unified"),)) for c in ("eager", "lazy"))
    return eager_lazy_view(run_jobs(jobs, n_jobs))


# -- the headline set: real traces x real hybrid models ----------------------------------

HEADLINE_TRACES = (
    TraceSpec(name="azure_conv", end_s=90.0, rate_scale=2.0),
    TraceSpec(name="azure_code", start_s=180.0, end_s=270.0),
    TraceSpec(name="mooncake_conversation", end_s=40.0, spread_s=3.0, max_context_tokens=32768,
              rate_scale=0.5, prefix_cache=False),
    TraceSpec(name="sharegpt_lengths", end_s=90.0, rate_rps=3.0),
)
"""One slice per trace. azure_code's slice is its first burst (few arrivals
from 60 s to 180 s); Mooncake is clipped to 32k-token requests (its longest
is 122k), spread over its 3 s buckets, and replayed with the prefix cache off
(the engine's admission guard does not count evictable cached blocks as room,
so a full cache stalls admission: docs/results.md); ShareGPT lengths get
Poisson arrivals."""

HEADLINE_MODELS = {"gemma-3-12b": 1.0, "gpt-oss-20b": 3.0, "nemotron-3-nano-30b-a3b": 1.5,
                   "llama-3.1-8b": 1.0}
"""Model -> extra rate multiplier, so that each model's unconstrained run holds
tens of requests (gpt-oss and Nemotron need far less KV per request)."""

SMALL_WINDOW_S = 6.0
SMALL_MAX_REQUESTS = 12


def small(spec: TraceSpec, window_s: float = SMALL_WINDOW_S,
          max_requests: int = SMALL_MAX_REQUESTS) -> TraceSpec:
    """A tiny slice of `spec` (its first `window_s` seconds, at most
    `max_requests` requests), for tests and smoke runs."""
    end = spec.start_s + window_s
    return replace(spec, end_s=min(end, spec.end_s or end), max_requests=max_requests)


def headline_pairs(traces_: Sequence[TraceSpec] = HEADLINE_TRACES,
                   models: dict = HEADLINE_MODELS, *, small_slices: bool = False,
                   traces_dir: Optional[Path] = None) -> list[tuple[TraceSpec, str]]:
    """(slice, model) pairs, each slice sped up by the model's multiplier."""
    out = []
    for spec in traces_:
        spec = spec.with_source(traces_dir)
        if small_slices:
            spec = small(spec)
        out.extend((replace(spec, rate_scale=spec.rate_scale * k), m) for m, k in models.items())
    return out


def calibrated_cases(pairs: Sequence[tuple[TraceSpec, str]], calibration: pd.DataFrame) -> list[Case]:
    """One Case per pair at the calibrated `budget_gib`."""
    return [Case(trace=t, model=m, kv_budget_gib=float(b))
            for (t, m), b in zip(pairs, calibration["budget_gib"])]


def capacity_study(trace: TraceSpec, model: str, kv_budget_gib: float,
                   layouts: Sequence[str] = ("static", "unified", "oracle"),
                   compaction: str = "lazy", **cfg) -> dict[str, RunResult]:
    """Runs of one case with their step tables: label -> RunResult
    ("unified" stands for the model's end_end / end_float_end layout)."""
    out = {}
    for layout in layouts:
        kind = _unified_kind(model) if layout == "unified" else layout
        label = f"{kind}/{compaction}" if kind in ("end_end", "end_float_end") else kind
        out[label] = capacity_over_time(trace, model, kv_budget_gib, kind, compaction, **cfg)
    return out


# -- figures of the tables above (they read tables, never run anything) ---------------------

LABEL_COLORS = {"static (default)": "#bbbbbb", "static (best of sweep)": "#666666",
                "end_end/lazy": "#1f77b4", "end_end/eager": "#aec7e8",
                "end_float_end/lazy": "#2ca02c", "end_float_end/eager": "#98df8a"}


def _figure(*args, **kwargs):
    import sim.figures  # noqa: F401  (selects the file-only backend)
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _case_label(row) -> str:
    return f"{row['trace']} | {row['model']} | {row['kv_budget_gib']:g} GiB"


def plot_layouts(table: pd.DataFrame, path: Path, metric: str = "capacity_efficiency") -> Path:
    """Grouped bars per case (a `headline` table): `metric` of each layout."""
    labels = [x for x in LABEL_COLORS if x in set(table["label"])]
    cases = table[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    fig, ax = _figure(figsize=(max(8, 0.75 * len(cases)), 6.5))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        rows = cases.merge(table[table["label"] == label], on=CASE_KEYS, how="left")
        ax.bar(np.arange(len(cases)) + i * width, rows[metric].fillna(0), width,
               color=LABEL_COLORS[label], label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="oracle")
    ax.set_xticks(np.arange(len(cases)) + width * (len(labels) - 1) / 2,
                  [_case_label(r) for _, r in cases.iterrows()], fontsize=6, rotation=90)
    ax.set_ylabel(metric.replace("_", " ") + " (vs oracle)")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    return _save(fig, path)


def plot_sweep(sweep: pd.DataFrame, table: pd.DataFrame, path: Path) -> Path:
    """Capacity efficiency of the static split vs its ratio, one panel per
    case; the default ratio as an open marker, the unified layout as a line."""
    sweep = sweep[sweep["role"] == "static_sweep"].pipe(lambda d: sweep.merge(
        d[CASE_KEYS].drop_duplicates(), on=CASE_KEYS))  # cases with a ratio to sweep
    cases = sweep[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    if cases.empty:
        fig, ax = _figure(figsize=(4, 2))
        ax.text(0.5, 0.5, "no static ratio to sweep", ha="center")
        return _save(fig, path)
    cols = min(4, len(cases))
    rows_n = -(-len(cases) // cols)
    fig, axes = _figure(rows_n, cols, figsize=(3.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax, (_, case) in zip(axes.flat, cases.iterrows()):
        mine = sweep.merge(case.to_frame().T, on=CASE_KEYS)
        x = mine["static_swa_full_tokens"].fillna(mine["static_mamba_full_memory"])
        ok = mine["error"].isna()
        sw = (mine["role"] == "static_sweep") & ok
        order = x[sw].sort_values().index
        ax.plot(x[order], mine.loc[order, "capacity_efficiency"], "o-", ms=3, color="#666666")
        dflt = (mine["role"] == "static_default") & ok
        ax.plot(x[dflt], mine.loc[dflt, "capacity_efficiency"], "o", mfc="none", color="red",
                label="default ratio")
        uni = table.merge(case.to_frame().T, on=CASE_KEYS)
        for _, u in uni[uni["label"].str.endswith("/lazy")].iterrows():
            ax.axhline(u["capacity_efficiency"], color=LABEL_COLORS.get(u["label"], "C0"), lw=1,
                       label=u["label"])
        ax.set_title(f"{case['trace']} | {case['model']}", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("static ratio (swa/full tokens, or mamba/full bytes)", fontsize=8)
    fig.supylabel("capacity efficiency vs oracle", fontsize=8)
    return _save(fig, path)


def plot_eager_lazy(table: pd.DataFrame, path: Path) -> Path:
    """Bytes moved and compaction overhead per case, eager vs lazy."""
    cases = table[CASE_KEYS].drop_duplicates().reset_index(drop=True)
    fig, (a1, a2) = _figure(1, 2, figsize=(max(10, 1.2 * len(cases)), 6.5))
    x = np.arange(len(cases))
    for i, mode in enumerate(("eager", "lazy")):
        rows = cases.merge(table[table["compaction"] == mode], on=CASE_KEYS, how="left")
        color = "#aec7e8" if mode == "eager" else "#1f77b4"
        a1.bar(x + 0.4 * i, rows["moved_gib"], 0.4, color=color, label=mode)
        a2.bar(x + 0.4 * i, 100 * rows["compaction_overhead_all"], 0.4, color=color, label=mode)
    names = [_case_label(r) for _, r in cases.iterrows()]
    for ax, label in ((a1, "GiB moved"), (a2, "move time / busy time (%)")):
        ax.set_xticks(x + 0.2, names, fontsize=6, rotation=90)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    a1.set_yscale("symlog", linthresh=0.01)
    return _save(fig, path)


def plot_capacity_compared(results: dict, path: Path, title: str = "") -> Path:
    """Available tokens and running requests over time, one line per layout
    (a `capacity_study` result); admission stalls of each run as ticks."""
    fig, (a1, a2) = _figure(2, 1, figsize=(10, 5.5), sharex=True)
    for label, res in results.items():
        s = res.steps.iloc[:: max(1, len(res.steps) // 3000)]
        a1.plot(s["t_s"], s["available_tokens"], lw=0.8, label=label)
        a2.plot(s["t_s"], s["running"], lw=0.8, label=label)
    a1.set_ylabel("available tokens")
    a1.set_yscale("symlog")
    a2.set_ylabel("running requests")
    a2.set_xlabel("simulated time (s)")
    a1.set_title(title, fontsize=9)
    a1.legend(fontsize=7)
    return _save(fig, path)
