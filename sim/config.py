"""One source of defaults for a simulation run; the CLI is derived from it.

Each field's `help` metadata is its command-line help (`sim/cli.py` turns
every field into a `--flag` of the field's type).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from unikv.sim.model_spec import check_kv_cache_dtype

LAYOUTS = (
    "fixed_ratio",
    "sglang",
    "end_end", "end_float_end", "oracle",
    "vllm",
)
COMPACTIONS = ("lazy", "eager")
OVERSIZE = ("error", "reject")
EXECUTORS = ("cost", "real")
"""What runs a step: the cost model, or real model forwards over the pool (`sim.real`)."""
REAL_CLOCKS = ("measured", "cost")
REAL_DTYPES = ("fp32", "bf16")
REAL_LAYOUTS = ("fixed_ratio", "sglang", "end_end", "end_float_end")
"""The layouts whose pool keeps bytes the real executor's KV views can read
(the oracle and vLLM pools count bytes without a byte layout)."""
RATIO_LAYOUTS = ("fixed_ratio",)
"""The layouts `static_ratio` applies to (`sim.layouts.build_layout`)."""
COMPACTING_LAYOUTS = ("end_end", "end_float_end")
"""The layouts whose pool compacts (`LayoutPlan.make_pool`: fixed-ratio, sglang,
vllm and oracle pools ignore the mode), so the only ones `compaction="eager"` may name."""


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
    # Engine rules (sim.engines): the state each running request holds.
    engine: str | None = _opt(None, "engine whose state rules every layout runs under (sglang); "
                                    "none: the baseline layout's engine, else 1 slot and bf16 state")
    state_slots_per_request: int | None = _opt(None, "state slots per running request "
                                                     "(none: the engine's rule)")
    mamba_cache_strategy: str = _opt("extra_buffer", "SGLang mamba radix cache strategy "
                                                     "(no_buffer, extra_buffer, extra_buffer_lazy)")
    overlap_schedule: bool = _opt(True, "SGLang overlap scheduling (ping-pong buffer of 2 slots)")
    mamba_cache_mode: str | None = _opt(None, "vLLM mamba_cache_mode under vLLM's rules: none (no "
                                              "prefix hits on mamba hybrids) or align (states cached at "
                                              "block-aligned chunk ends); unset: none, the default of the "
                                              "vLLM v0.11 line the vllm layout follows")

    def __post_init__(self) -> None:
        for name in ("max_running", "prefill_tokens_per_step"):
            _check_int(f"scheduler.{name}", getattr(self, name), minimum=1)
        _check_reserve(self)
        check_block_tokens(self.block_tokens)
        self._check_engine()

    def _check_engine(self) -> None:
        from unikv.sim.engines import ENGINES
        from unikv.sim.sglang import MAMBA_STRATEGIES
        if self.engine is not None and self.engine not in ENGINES:
            raise ValueError(f"scheduler.engine={self.engine!r}; valid engines are {list(ENGINES)} "
                             "or none")
        slots = self.state_slots_per_request
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
            raise ValueError(f"scheduler.state_slots_per_request={slots!r} must be a positive "
                             "integer or none")
        if self.mamba_cache_strategy not in MAMBA_STRATEGIES:
            raise ValueError(f"scheduler.mamba_cache_strategy={self.mamba_cache_strategy!r}; valid "
                             f"strategies are {list(MAMBA_STRATEGIES)}")
        self._check_mamba_cache_mode()
        if self.mamba_cache_strategy == "extra_buffer_lazy" and not self.overlap_schedule:
            raise ValueError("scheduler.mamba_cache_strategy='extra_buffer_lazy' needs "
                             "overlap_schedule=True (SGLang refuses it without)")

    def _check_mamba_cache_mode(self) -> None:
        from unikv.sim.vllm_rules import MAMBA_CACHE_ALL, MAMBA_CACHE_MODES
        mode = self.mamba_cache_mode
        if mode == "all":
            raise ValueError(f"scheduler.mamba_cache_mode='all': {MAMBA_CACHE_ALL}")
        if mode is not None and mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"scheduler.mamba_cache_mode={mode!r}; valid modes are "
                             f"{list(MAMBA_CACHE_MODES)} or none")


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
        kv_cache_dtype: the KV cache's dtype: "bf16", "fp8_e4m3", "fp8_e5m2", "fp32",
            or an fp4 layout an engine pins ("fp4_e2m1": SGLang, "nvfp4": vLLM)
            (`sim.models.load_model`; docs/models.md, "Dtypes").
        kv_budget_gib: bytes of the shared KV buffer, GiB.
        page_size: tokens per page of the token bands.
        layout: one of LAYOUTS.
        compaction: "lazy" or "eager" (END bands of unified layouts).
        static_ratio: the fixed_ratio split's ratio (see sim.layouts); None: default.
        oversize: "error" stops before the run if a trace request can never
            fit the layout; "reject" runs and counts such requests rejected.
        seed: RNG seed of the trace transforms that sample (Poisson spacing,
            bucket spread).
        check_every: verify pool invariants and page accounting every N
            steps (0: never; tests use 1).
        gpu: a bundled GPU spec by name (`sim.hardware.gpu_names()`);
            None: `hardware` names the accelerator.
        hardware: the accelerator's cost coefficients: a bundled name
            (`sim.cost.hardware_names()`) or a hardware JSON file
            (`HardwareSpec.load`; docs/cost_model.md).
        executor: "cost" (the cost model times each step) or "real" (a
            transformers forward per step over the pool; docs/real_executor.md).
        weights: real executor: a folder of safetensors for the model's
            config (None: random weights seeded by `seed`).
        device: real executor: "cpu", "cuda" or "cuda:N".
        dtype: real executor: the model's dtype, "fp32" or "bf16" (None: the
            KV-cache dtype's; the pool stores KV in the model's dtype).
        real_clock: real executor: the clock advances by the "measured" step
            time, or by the "cost" model's (the same steps as a cost-model run).
        decode_graphs: real executor: decode-only steps run through static
            buffers per batch-size bucket, captured as CUDA graphs on a GPU
            (`sim.real.graphs`).
        compile_decode: real executor with `decode_graphs`: each decoder
            layer of the decode step compiled with torch.compile (inductor),
            attention and the KV write one opaque operator, inside the
            captured graph (`DecodeGraphs(compile=True)`); a bucket whose
            compile or capture fails runs uncompiled and the summary says why.
        compile_prefill: real executor: the steps with a prefill chunk (the
            packed prefill and mixed steps) run with each decoder layer
            compiled as `compile_decode` compiles it, every chunk size one
            graph (`sim.real.prefill.CompiledPrefill`); a compile that fails
            leaves the steps eager and the summary says why.
        prefill_graphs: real executor: the packed steps of up to 2,048
            tokens and `scheduler.max_running` requests run through static
            buffers per token-count bucket, captured as CUDA graphs on a GPU
            (`sim.real.packed_graphs`), with `compile_prefill` over the
            compiled layers; larger steps run as without it, and a bucket
            whose capture fails runs uncaptured (the summary says why).
        With either, the model's q/k/v and gate/up projections run as one
        matmul each in every step (`sim.real.fuse`), as engines hold them.
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
    kv_cache_dtype: str = _opt("bf16", "KV-cache dtype: bf16, fp8_e4m3, fp8_e5m2, fp32, fp4_e2m1 (SGLang) "
                                                     "or nvfp4 (vLLM)")
    kv_budget_gib: float = _opt(8.0, "KV buffer size in GiB")
    page_size: int = _opt(16, "tokens per page")
    layout: str = _opt("end_end", "layout kind")
    compaction: str = _opt("lazy", "compaction of unified END bands")
    static_ratio: float | None = _opt(None, "fixed_ratio split ratio (swa/full tokens, or mamba/full bytes)")
    oversize: str = _opt("error", "a request that can never fit: stop before the run, or reject it")
    seed: int = _opt(0, "seed of sampled trace transforms (Poisson arrivals, spread)")
    check_every: int = _opt(0, "verify pool invariants every N steps (0: never)")
    hardware: str = _opt("h200", "bundled hardware name (h200) or a hardware JSON file (docs/cost_model.md)")
    gpu: str | None = _opt(None, "bundled GPU spec by name (h200, h100-sxm, b200, ...; default: --hardware's)")
    executor: str = _opt("cost", "what runs the steps: cost (the cost model) or real (model forwards)")
    weights: str | None = _opt(None, "real executor: folder of safetensors (none: random weights)")
    device: str = _opt("cpu", "real executor: cpu, cuda or cuda:N")
    dtype: str | None = _opt(None, "real executor: model dtype fp32 or bf16 (none: the KV-cache dtype)")
    real_clock: str = _opt("measured", "real executor: advance the clock by the measured or the cost-model step time")
    decode_graphs: bool = _opt(False, "real executor: decode steps through static per-bucket buffers, "
                                      "captured as CUDA graphs on a GPU")
    compile_decode: bool = _opt(False, "real executor with --decode-graphs: each decoder layer compiled with "
                                       "torch.compile (inductor) inside the captured decode graph, and the "
                                       "q/k/v and gate/up projections fused")
    compile_prefill: bool = _opt(False, "real executor: prefill and mixed steps with each decoder layer compiled "
                                        "with torch.compile (inductor), one graph for every chunk size, and the "
                                        "q/k/v and gate/up projections fused")
    prefill_graphs: bool = _opt(False, "real executor: prefill and mixed steps of up to 2,048 tokens through "
                                       "static per-token-bucket buffers, captured as CUDA graphs on a GPU")
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        for name, valid, what in (("layout", LAYOUTS, "layouts"), ("compaction", COMPACTIONS, "modes"),
                                  ("oversize", OVERSIZE, "modes")):
            if getattr(self, name) not in valid:
                hint = " ('static' is now 'fixed_ratio')" if getattr(self, name) == "static" else ""
                raise ValueError(f"{name}={getattr(self, name)!r}; valid {what} are {list(valid)}{hint}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        if not isinstance(self.hardware, str) or not self.hardware:
            raise ValueError(f"hardware={self.hardware!r} must be a bundled hardware name or a file path")
        _check_gpu(self)
        _check_numbers(self)
        _check_trace_window(self)
        _check_applies(self)
        _check_executor(self)

    def with_(self, **changes) -> RunConfig:
        """A copy with `changes` (scheduler fields may be given flat)."""
        sched = {k: changes.pop(k) for k in list(changes) if k in SCHEDULER_FIELDS}
        if sched:
            changes["scheduler"] = replace(self.scheduler, **sched)
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def _check_gpu(config: RunConfig) -> None:
    """Refuse an unknown `gpu` (one line listing the bundled ones), or a
    `gpu` given beside a non-default `hardware` (which of the two?)."""
    if config.gpu is None:
        return
    from unikv.sim.hardware import gpu_names

    if not isinstance(config.gpu, str) or config.gpu not in gpu_names():
        raise ValueError(f"gpu={config.gpu!r} is not a bundled GPU; known: {', '.join(gpu_names())}")
    if config.hardware != "h200":
        raise ValueError(f"gpu={config.gpu!r} and hardware={config.hardware!r} both name the accelerator; "
                         "give one (--gpu NAME for a bundled spec, --hardware FILE for your own)")


def _check_int(name: str, value, *, minimum: int) -> None:
    """Raise unless `value` is an int (not a bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}={value!r} must be {what}")


def _check_real(name: str, value, *, positive: bool = False, optional: bool = False) -> None:
    """Raise unless `value` is a finite real number (> 0 when `positive`;
    None allowed when `optional`). inf and nan are refused: a window or a
    rate of inf would run forever or silently select nothing."""
    if value is None and optional:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (positive and not value > 0):
        what = "a finite number" + (" > 0" if positive else "") + (" or None" if optional else "")
        raise ValueError(f"{name}={value!r} must be {what}")


def _check_reserve(sched: SchedulerConfig) -> None:
    """The decode reserve: ratios in [0, 1], init >= min, decay finite >= 0."""
    for name in ("reserve_init", "reserve_min"):
        value = getattr(sched, name)
        _check_real(f"scheduler.{name}", value)
        if not 0 <= value <= 1:
            raise ValueError(f"scheduler.{name}={value!r} must be a ratio in [0, 1]")
    if sched.reserve_init < sched.reserve_min:
        raise ValueError(f"scheduler.reserve_init={sched.reserve_init!r} must be >= "
                         f"scheduler.reserve_min={sched.reserve_min!r} (the reserve decays from init to min)")
    _check_real("scheduler.reserve_decay", sched.reserve_decay)
    if sched.reserve_decay < 0:
        raise ValueError(f"scheduler.reserve_decay={sched.reserve_decay!r} must be >= 0")


def _check_numbers(config: RunConfig) -> None:
    """Every number of a RunConfig: finite, in range, of its type."""
    for name in ("kv_budget_gib", "rate_scale"):
        _check_real(name, getattr(config, name), positive=True)
    for name in ("rate_rps", "spread_s"):
        _check_real(name, getattr(config, name), positive=True, optional=True)
    _check_int("page_size", config.page_size, minimum=1)
    for name in ("max_context_tokens", "max_requests"):
        if getattr(config, name) is not None:
            _check_int(name, getattr(config, name), minimum=1)
    for name in ("seed", "check_every"):
        _check_int(name, getattr(config, name), minimum=0)


def _check_trace_window(config: RunConfig) -> None:
    """`[trace_start_s, trace_end_s)`: finite bounds, start < end."""
    _check_real("trace_start_s", config.trace_start_s)
    _check_real("trace_end_s", config.trace_end_s, optional=True)
    if config.trace_end_s is not None and not config.trace_start_s < config.trace_end_s:
        raise ValueError(f"trace_end_s={config.trace_end_s!r} must be > trace_start_s={config.trace_start_s!r} "
                         "(the window [start, end) would be empty)")


def _check_applies(config: RunConfig) -> None:
    """Options that do nothing for the chosen layout are refused, not recorded."""
    ratio = config.static_ratio
    if ratio is not None and config.layout not in RATIO_LAYOUTS:
        raise ValueError(f"static_ratio={ratio!r} applies only to layout {' or '.join(RATIO_LAYOUTS)}, "
                         f"not layout={config.layout!r}; leave it unset")
    if isinstance(ratio, (int, float)):  # a StaticRatio checks its own fields
        _check_real("static_ratio", ratio, positive=True)
    if config.compaction != "lazy" and config.layout not in COMPACTING_LAYOUTS:
        raise ValueError(f"compaction={config.compaction!r} has no effect on layout={config.layout!r} "
                         f"(only {', '.join(COMPACTING_LAYOUTS)} compact); leave it at 'lazy'")


def _check_executor(config: RunConfig) -> None:
    """The executor and its options: real-executor options need executor='real'."""
    if config.executor not in EXECUTORS:
        raise ValueError(f"executor={config.executor!r}; valid executors are {list(EXECUTORS)}")
    if config.real_clock not in REAL_CLOCKS:
        raise ValueError(f"real_clock={config.real_clock!r}; valid clocks are {list(REAL_CLOCKS)}")
    if config.dtype is not None and config.dtype not in REAL_DTYPES:
        raise ValueError(f"dtype={config.dtype!r}; valid dtypes are {list(REAL_DTYPES)} or none")
    device = config.device
    if not isinstance(device, str) or not (device in ("cpu", "cuda") or
                                           (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device={device!r} must be 'cpu', 'cuda' or 'cuda:N'")
    if config.executor == "cost":
        for name, default in (("weights", None), ("device", "cpu"), ("dtype", None), ("real_clock", "measured"),
                              ("decode_graphs", False), ("compile_decode", False), ("compile_prefill", False),
                              ("prefill_graphs", False)):
            if getattr(config, name) != default:
                raise ValueError(f"{name}={getattr(config, name)!r} applies only to executor='real'; "
                                 "pass executor='real' or leave it unset")
        return
    if config.compile_decode and not config.decode_graphs:
        raise ValueError("compile_decode=True compiles the captured decode step; pass decode_graphs=True too")
    if config.layout not in REAL_LAYOUTS:
        raise ValueError(f"layout={config.layout!r}: the real executor cannot view its pool (it keeps no byte "
                         f"layout); valid layouts for executor='real' are {list(REAL_LAYOUTS)}")
    dtype = config.dtype or config.kv_cache_dtype
    if dtype not in REAL_DTYPES or config.kv_cache_dtype != dtype:
        raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype!r} with dtype={config.dtype!r}: the real "
                         f"executor stores KV in the model's dtype, one of {list(REAL_DTYPES)}; pass the "
                         "same kv_cache_dtype and dtype")


SCHEDULER_FIELDS = {f.name for f in fields(SchedulerConfig)}
TRACE_FIELDS = ("trace", "rate_rps", "spread_s", "trace_start_s", "trace_end_s", "max_context_tokens",
                "rate_scale", "max_requests", "seed")
"""The RunConfig fields that select the requests (`sim.run.load_trace`)."""
