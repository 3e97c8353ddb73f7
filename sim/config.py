"""One source of defaults for a simulation run; the CLI is derived from it.

Each field's `help` metadata is its command-line help (`sim/cli.py` turns
every field into a `--flag` of the field's type).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

LAYOUTS = ("static", "end_end", "end_float_end", "oracle")
COMPACTIONS = ("lazy", "eager")
OVERSIZE = ("error", "reject")


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


def check_block_tokens(value) -> None:
    """Refuse a prefix block size that is neither None nor a positive integer.

    Args:
        value: `SchedulerConfig.block_tokens`, tokens per prefix-cache block;
            None means the trace's own block size.

    Raises:
        ValueError: naming the field; 0 and negatives are refused, not read
            as "the trace's" or "no cache" (`sim.prefix_cache.cache_block_tokens`
            checks the size against the trace).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"scheduler.block_tokens={value!r} must be a positive integer (tokens per "
                         "prefix block) or None (the trace's own block size)")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The engine's scheduling knobs (SGLang-like defaults)."""

    max_running: int = _opt(256, "max running requests")
    prefill_tokens_per_step: int = _opt(8192, "chunked-prefill token budget per step")
    prefix_cache: bool = _opt(True, "reuse cached prompt blocks (traces with prefix hashes)")
    block_tokens: int | None = _opt(None, "prefix block size in tokens (default: the trace's)")
    # Decode reserve at admission, after SGLang's new_token_ratio
    # (schedule_policy / scheduler: init 0.7, floor 0.1, linear decay).
    reserve_init: float = _opt(0.7, "decode reserve ratio at start and after a retraction")
    reserve_min: float = _opt(0.1, "floor of the decode reserve ratio")
    reserve_decay: float = _opt(0.001, "decode reserve ratio decay per step")

    def __post_init__(self) -> None:
        for name in ("max_running", "prefill_tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"scheduler.{name}={value!r} must be a positive integer")
        check_block_tokens(self.block_tokens)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run = trace x model x layout x compaction x hardware.

    The trace transforms apply in this order (`sim.run.load_trace`): load
    (Poisson arrivals at `rate_rps` for traces without timestamps; equal
    timestamps spread over `spread_s`), keep `[trace_start_s, trace_end_s)`,
    clip each request to `max_context_tokens`, replay `rate_scale` times
    faster, keep the first `max_requests`.

    Attributes:
        trace: a bundled sample name (see `traces.samples.names()`) or a path.
        rate_rps: Poisson arrival rate (requests/s) for traces without
            timestamps (e.g. sharegpt_lengths); None: the file's times (all
            0 s for a length-only trace).
        spread_s: spread requests sharing one timestamp uniformly over this
            many seconds (Mooncake's 3 s buckets: 3.0); None: bursts.
        trace_start_s, trace_end_s: time window of the trace (seconds; the
            default replays the first 300 s, about a minute on a laptop CPU).
        max_context_tokens: clip prompt + output of each request to this many
            tokens (prompt first, `traces.clip_to_context`); None: no clip.
        rate_scale: replay k times faster (>1) or slower (<1).
        max_requests: keep only the first N requests.
        model: a bundled model name or a Hugging Face config.json path.
        kv_budget_gib: bytes of the shared KV buffer, GiB.
        page_size: tokens per page of the token bands.
        layout: one of LAYOUTS.
        compaction: "lazy" or "eager" (END bands of unified layouts).
        static_ratio: the static split's ratio (see sim.layouts); None: default.
        oversize: "error" stops before the run if a trace request can never
            fit the layout; "reject" runs and counts such requests rejected.
        seed: RNG seed of the trace transforms that sample (Poisson spacing,
            bucket spread).
        check_every: verify pool invariants and page accounting every N
            steps (0: never; tests use 1).
        hardware: the accelerator's cost coefficients: a bundled name
            (`sim.cost.hardware_names()`) or a hardware JSON file
            (`HardwareSpec.load`; docs/cost_model.md).
    """

    trace: str = _opt("azure_conv", "bundled sample name or trace file path")
    rate_rps: float | None = _opt(None, "Poisson arrivals (req/s) for traces without timestamps")
    spread_s: float | None = _opt(None, "spread equal timestamps over this many seconds (Mooncake: 3)")
    trace_start_s: float = _opt(0.0, "start of the trace window, s")
    trace_end_s: float | None = _opt(300.0, "end of the trace window, s (none: no end)")
    max_context_tokens: int | None = _opt(None, "clip each request to this many tokens")
    rate_scale: float = _opt(1.0, "replay this many times faster")
    max_requests: int | None = _opt(None, "keep the first N requests")
    model: str = _opt("gemma-3-12b", "bundled model name or a Hugging Face config.json path")
    kv_budget_gib: float = _opt(8.0, "KV buffer size in GiB")
    page_size: int = _opt(16, "tokens per page")
    layout: str = _opt("end_end", "layout kind")
    compaction: str = _opt("lazy", "compaction of unified END bands")
    static_ratio: float | None = _opt(None, "static split ratio (swa/full tokens, or mamba/full bytes)")
    oversize: str = _opt("error", "a request that can never fit: stop before the run, or reject it")
    seed: int = _opt(0, "seed of sampled trace transforms (Poisson arrivals, spread)")
    check_every: int = _opt(0, "verify pool invariants every N steps (0: never)")
    hardware: str = _opt("h200", "bundled hardware name (h200) or a hardware JSON file (docs/cost_model.md)")
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        for name, valid, what in (("layout", LAYOUTS, "layouts"), ("compaction", COMPACTIONS, "modes"),
                                  ("oversize", OVERSIZE, "modes")):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name}={getattr(self, name)!r}; valid {what} are {list(valid)}")
        for name in ("kv_budget_gib", "rate_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        for name in ("rate_rps", "spread_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0 or None")
        if not isinstance(self.hardware, str) or not self.hardware:
            raise ValueError(f"hardware={self.hardware!r} must be a bundled hardware name or a file path")
        for name in ("page_size", "max_context_tokens", "max_requests"):
            value = getattr(self, name)
            if (value is not None or name == "page_size") and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer")

    def with_(self, **changes) -> RunConfig:
        """A copy with `changes` (scheduler fields may be given flat)."""
        sched = {k: changes.pop(k) for k in list(changes) if k in SCHEDULER_FIELDS}
        if sched:
            changes["scheduler"] = replace(self.scheduler, **sched)
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


SCHEDULER_FIELDS = {f.name for f in fields(SchedulerConfig)}
TRACE_FIELDS = ("trace", "rate_rps", "spread_s", "trace_start_s", "trace_end_s", "max_context_tokens",
                "rate_scale", "max_requests", "seed")
"""The RunConfig fields that select the requests (`sim.run.load_trace`)."""
