"""What one run replays: a trace slice (`TraceSpec`) and a case (slice x model x budget)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import pandas as pd
from unikv.sim.config import RunConfig
from unikv.sim.run import RunResult, load_trace, run

from unikv import traces


@dataclass(frozen=True, kw_only=True)
class TraceSpec:
    """One slice of a trace, as the analyses replay it.

    Each field maps onto a `RunConfig` trace field (`run_fields`), and the
    slice is loaded by `sim.run.load_trace`, the simulator's one loader: load
    (Poisson arrivals at `rate_rps` for length-only traces; Mooncake buckets
    spread over `spread_s`), keep `[start_s, end_s)`, clip each request to
    `max_context_tokens` (prompt first), replay `rate_scale` times faster,
    keep the first `max_requests`.

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
    source: str | None = None
    start_s: float = 0.0
    end_s: float | None = 120.0
    rate_scale: float = 1.0
    rate_rps: float | None = None
    spread_s: float | None = None
    max_context_tokens: int | None = None
    max_requests: int | None = None
    seed: int = 0
    prefix_cache: bool = True

    @property
    def path(self) -> str:
        return self.source or self.name

    def with_source(self, traces_dir: Path | None) -> TraceSpec:
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
        return {"trace": self.path, "rate_rps": self.rate_rps, "spread_s": self.spread_s,
                "trace_start_s": self.start_s, "trace_end_s": self.end_s,
                "max_context_tokens": self.max_context_tokens, "rate_scale": self.rate_scale,
                "max_requests": self.max_requests, "seed": self.seed}


@lru_cache(maxsize=32)
def _load_trace(spec: TraceSpec) -> pd.DataFrame:
    return load_trace(RunConfig(**spec.run_fields()))


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
