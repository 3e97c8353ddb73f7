"""The headline set (real trace slices x real hybrid models) and the studies run on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd
from unikv.sim.analyses.jobs import Job, run_jobs
from unikv.sim.analyses.ratios import _unified_kind
from unikv.sim.analyses.slices import Case, TraceSpec, capacity_over_time
from unikv.sim.analyses.views import eager_lazy_view
from unikv.sim.run import RunResult

HEADLINE_TRACES = (
    TraceSpec(name="azure_conv", end_s=90.0, rate_scale=2.0),
    TraceSpec(name="azure_code", start_s=180.0, end_s=270.0),
    TraceSpec(name="mooncake_conversation", end_s=40.0, spread_s=3.0, max_context_tokens=32768,
              rate_scale=0.5),
    TraceSpec(name="sharegpt_lengths", end_s=90.0, rate_rps=3.0),
)
"""One slice per trace. azure_code's slice is its first burst (few arrivals
from 60 s to 180 s); Mooncake is clipped to 32k-token requests (its longest
is 122k), spread over its 3 s buckets, and replayed with the prefix cache on
(the admission reserve counts evictable cached blocks as room); ShareGPT
lengths get Poisson arrivals."""


HEADLINE_MODELS = {"gemma-3-12b": 1.0, "gpt-oss-20b": 3.0, "nemotron-3-nano-30b-a3b": 1.5,
                   "llama-3.1-8b": 1.0, "hymba-1.5b-base": 3.0}
"""Model -> extra rate multiplier, so that each model's unconstrained run holds
tens of requests (gpt-oss, Nemotron and Hymba need far less KV per request).
Hymba is the one model with all three band kinds (its unified layout is
end/float/end)."""


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
                   traces_dir: Path | None = None) -> list[tuple[TraceSpec, str]]:
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
                   layouts: Sequence[str] = ("fixed_ratio", "unified", "oracle"),
                   compaction: str = "lazy", **cfg) -> dict[str, RunResult]:
    """Runs of one case with their step tables: label -> RunResult
    ("unified" stands for the model's end_end / end_float_end layout)."""
    out = {}
    for layout in layouts:
        kind = _unified_kind(model) if layout == "unified" else layout
        label = f"{kind}/{compaction}" if kind in ("end_end", "end_float_end") else kind
        out[label] = capacity_over_time(trace, model, kv_budget_gib, kind, compaction, **cfg)
    return out


def eager_vs_lazy(cases: Sequence[Case], *, n_jobs: int = 1) -> pd.DataFrame:
    """Compaction cost and admission of the unified layout, eager vs lazy, per case
    (cases of a one-band model included: their single END band still compacts)."""
    jobs = []
    for case in cases:
        jobs.extend(Job(case, (("layout", _unified_kind(case.model)), ("compaction", c)),
                        (("role", "unified"),)) for c in ("eager", "lazy"))
    return eager_lazy_view(run_jobs(jobs, n_jobs))
