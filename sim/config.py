"""One source of defaults for a simulation run; the CLI is derived from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Optional

LAYOUTS = ("static", "end_end", "end_float_end", "oracle")
COMPACTIONS = ("lazy", "eager")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The engine's scheduling knobs (SGLang-like defaults)."""

    max_running: int = 256  # max running requests
    prefill_tokens_per_step: int = 8192  # chunked-prefill token budget per step
    prefix_cache: bool = True  # reuse cached prompt blocks (traces with hashes)
    block_tokens: Optional[int] = None  # prefix block size; None: the trace's
    # Decode reserve at admission, after SGLang's new_token_ratio
    # (schedule_policy / scheduler: init 0.7, floor 0.1, linear decay).
    reserve_init: float = 0.7
    reserve_min: float = 0.1
    reserve_decay: float = 0.001

    def __post_init__(self) -> None:
        for name in ("max_running", "prefill_tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"scheduler.{name}={value!r} must be a positive integer")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run = trace x model x layout x compaction x hardware.

    Attributes:
        trace: a bundled sample name (see `traces.samples.names()`) or a path.
        trace_start_s, trace_end_s: time window of the trace (seconds; the
            default replays the first 300 s, about a minute on a laptop CPU).
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
        seed: RNG seed (trace transforms that sample).
        check_every: verify pool invariants and page accounting every N
            steps (0: never; tests use 1).
    """

    trace: str = "azure_conv"
    trace_start_s: float = 0.0
    trace_end_s: Optional[float] = 300.0
    rate_scale: float = 1.0
    max_requests: Optional[int] = None
    model: str = "gemma-3-12b"
    kv_budget_gib: float = 8.0
    page_size: int = 16
    layout: str = "end_end"
    compaction: str = "lazy"
    static_ratio: Optional[float] = None
    oversize: str = "error"
    seed: int = 0
    check_every: int = 0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}; valid layouts are {list(LAYOUTS)}")
        if self.compaction not in COMPACTIONS:
            raise ValueError(f"compaction={self.compaction!r}; valid modes are {list(COMPACTIONS)}")
        if self.oversize not in ("error", "reject"):
            raise ValueError(f"oversize={self.oversize!r} must be 'error' or 'reject'")
        if not self.kv_budget_gib > 0:
            raise ValueError(f"kv_budget_gib={self.kv_budget_gib!r} must be > 0")
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size={self.page_size!r} must be a positive integer")
        if not self.rate_scale > 0:
            raise ValueError(f"rate_scale={self.rate_scale!r} must be > 0")

    def with_(self, **changes) -> "RunConfig":
        """A copy with `changes` (scheduler fields may be given flat)."""
        sched = {k: changes.pop(k) for k in list(changes) if k in SCHEDULER_FIELDS}
        if sched:
            changes["scheduler"] = replace(self.scheduler, **sched)
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


SCHEDULER_FIELDS = {f.name for f in fields(SchedulerConfig)}
