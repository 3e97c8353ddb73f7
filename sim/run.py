"""Run a simulation from a `RunConfig`, and write its outputs."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from unikv.sim import cost as cost_model
from unikv.sim.config import TRACE_FIELDS, RunConfig
from unikv.sim.engine import Simulation
from unikv.sim.engines import prefix_cache
from unikv.sim.engines import rules as engine_rules
from unikv.sim.fit import max_request_tokens
from unikv.sim.hardware import spec_source
from unikv.sim.layouts import ContextTooLongError, RequestTooLargeError, build_layout, check_fits
from unikv.sim.memory import Memory
from unikv.sim.models import load_model
from unikv.sim.outdir import staged_dir
from unikv.sim.prefix_cache import cover_blocks
from unikv.sim.request import Request
from unikv.sim.summary import summarize
from unikv.sim.vllm_rules import prefix_caching as vllm_prefix_caching

import unikv
from unikv import traces
from unikv.backends import SimBackend

GIB = 1 << 30


@dataclass
class RunResult:
    config: RunConfig
    identity: dict
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    violations: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector for a replay, then resume it.

    A replay allocates millions of short-lived objects, and each collection
    of the oldest generation walks every live one (the step rows and the
    requests grow all run): ~4 % of an hour's replay. The engine makes no
    reference cycle per step (a whole replay leaves a few dozen), and
    reference counting frees everything else as usual, so pausing costs no
    memory growth; the collector runs again as soon as the replay returns.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def torch_threads(n: int):
    """Pin torch to `n` intra-op threads for a replay, then restore them.

    Nothing in the replay path uses torch (the sim backend and its numpy
    ids); a process that imported torch anyway (a test, a notebook, the
    real executor) keeps one intra-op thread during the replay as before,
    where small-tensor work runs fastest. Torch is never imported here:
    when the process has not imported it, there is nothing to pin.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_trace(config: RunConfig) -> pd.DataFrame:
    """The requests of `config`: the one loader of the simulator.

    In order: load (Poisson arrivals at `rate_rps`, bucket spread over
    `spread_s`, both seeded by `seed`), keep `[trace_start_s, trace_end_s)`,
    clip to `max_context_tokens`, scale the rate, keep `max_requests`.

    Raises:
        ValueError: an unknown trace, bad transform options, or an empty slice.
    """
    opts = {"seed": config.seed, "rate_rps": config.rate_rps, "spread_s": config.spread_s}
    if config.trace in traces.samples.names():
        df = traces.load_sample(config.trace, **opts)
    elif Path(config.trace).exists() and config.max_requests is not None:  # read only what the slice needs
        df = traces.load_head(Path(config.trace), config.max_requests, start_s=config.trace_start_s,
                              end_s=config.trace_end_s, **opts)
    elif Path(config.trace).exists():
        df = traces.load(Path(config.trace), **opts)
    else:
        raise ValueError(f"trace {config.trace!r} is neither a file nor a bundled sample "
                         f"({', '.join(traces.samples.names())})")
    if df.empty:
        raise ValueError(f"trace {config.trace!r} holds no request (no data row, or every row was dropped: "
                         f"{df.attrs.get('dropped', {})})")
    if config.rate_rps is None and len(df) > 1 and not df["arrival_s"].any():
        warnings.warn(f"trace {config.trace!r} has no timestamps: every request arrives at 0 s "
                      "(set rate_rps for Poisson arrivals)", traces.TraceWarning, stacklevel=2)
    if config.trace_start_s or config.trace_end_s is not None:
        df = traces.window(df, start_s=config.trace_start_s, end_s=config.trace_end_s)
    if config.max_context_tokens is not None:
        df = traces.clip_to_context(df, max_context_tokens=config.max_context_tokens)
    if config.rate_scale != 1.0:
        df = traces.scale_rate(df, factor=config.rate_scale)
    if config.max_requests is not None:
        df = df.iloc[: config.max_requests]
    if df.empty:
        raise ValueError(f"trace {config.trace!r} has no request in the selected window")
    return df


def _trace_block(df: pd.DataFrame) -> int | None:
    """Tokens per prefix hash of a trace frame; None without hashes.

    Raises:
        ValueError: hashes without a block size in `df.attrs`.
    """
    if "prefix_hashes" not in df.columns:
        return None
    block = df.attrs.get("block_tokens")
    if block is None:
        raise ValueError("the trace has prefix_hashes but no df.attrs['block_tokens'] (tokens per hash)")
    return int(block)


def _requests(df: pd.DataFrame) -> list[Request]:
    hashes = df["prefix_hashes"] if "prefix_hashes" in df.columns else None
    out = []
    for i, (t, p, o) in enumerate(zip(df["arrival_s"], df["prompt_tokens"], df["output_tokens"])):
        h = tuple(hashes.iloc[i]) if hashes is not None else ()
        out.append(Request(i, float(t), int(p), int(o), h))
    return out


class KVRead:
    """KV (and state) bytes a batch's attention reads in one step: every
    position on the full band, the last `window` positions on the window
    band, and per request its state and the shared meta tokens' KV.

    `__call__(batch)` walks the batch; `from_totals` takes the sums the
    engine keeps for the running requests (`Memory.held_seq` /
    `held_window`) when the batch is all of them."""

    def __init__(self, model) -> None:
        self.full, self.swa = model.full_token_bytes, model.swa_token_bytes
        self.window = model.window_tokens or 0
        # every request's attention reads its state and the shared meta KV
        self.per_request = model.state_bytes + model.meta_tokens * (self.full + self.swa)

    def __call__(self, batch: list[Request]) -> int:
        seqs = [r.seq for r in batch]
        window = self.window
        inside = sum([s if s < window else window for s in seqs]) if self.swa else 0
        return self.from_totals(len(batch), sum(seqs), inside)

    def from_totals(self, requests: int, seq_total: int, window_total: int) -> int:
        """`self(batch)` from the batch's size, its positions summed, and
        its positions inside the window summed (`min(seq, window)`)."""
        total = self.full * seq_total + self.per_request * requests
        if self.swa:
            total += self.swa * window_total
        return total


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run(config: RunConfig, *, progress: Callable[[int, int], None] | None = None,
        trace_df: pd.DataFrame | None = None, hw=None) -> RunResult:
    """Replay the trace of `config` and return its tables and summary.

    `hw` (a `sim.cost.HardwareSpec`) replaces the accelerator `config.hardware`
    names; either way the identity records every coefficient used.

    Raises:
        ValueError: unknown model / layout, a trace the loader rejects, or
            (with `oversize="error"`) a request that can never fit the layout.
    """
    with torch_threads(1), gc_paused():
        return _run(config, progress, trace_df, hw)


def engine_model(config: RunConfig):
    """The engine rules `config` runs under (the same for every layout a
    comparison holds side by side) and the model loaded as they store it:
    `(EngineRules, ModelSpec)`.

    Raises:
        ValueError: an unknown model or a config the parser refuses.
    """
    state = engine_rules(config.scheduler, config.layout)
    return state, load_model(config.model, state_dtype=state.state_dtype,
                             kv_cache_dtype=config.kv_cache_dtype)


def layout_plan(config: RunConfig, model):
    """`build_layout` of `model` with the layout options of `config`."""
    return build_layout(model, kv_budget_gib=config.kv_budget_gib, page_size=config.page_size,
                        kind=config.layout, static_ratio=config.static_ratio)


def _run(config, progress, trace_df, hw) -> RunResult:
    t0 = time.perf_counter()
    hw, gpu, hw_source = _hardware(config, hw)  # first: a bad file fails before the replay
    df = load_trace(config) if trace_df is None else trace_df
    state, model = engine_model(config)
    plan = layout_plan(config, model)
    check_host_memory(plan, config.kv_budget_gib)
    trace_block = _trace_block(df)
    cache = prefix_cache(state, model, layout=config.layout, page_size=config.page_size, requested=config.scheduler.block_tokens,
                         trace_block=trace_block, enabled=config.scheduler.prefix_cache,
                         prefill_tokens_per_step=config.scheduler.prefill_tokens_per_step)
    block = cache.block_tokens
    if block is not None and block != trace_block and block % trace_block == 0:  # regroup the hashes
        df = traces.regroup_blocks(df, block_tokens=block)
    reqs = _requests(df)
    if block is not None and block % trace_block:  # vLLM's block over the trace's: whole blocks it covers
        chained: dict = {}
        for r in reqs:
            r.hashes = tuple(cover_blocks(r.hashes, trace_block, block, chained))
    # SGLang's cap first: a state pool without one request's slots refuses to start
    max_running = plan.max_running(config.scheduler.max_running, state.state_slots_per_request)
    # vLLM align: a prefilling request holds one more state slot (`Memory`)
    peak_slots = state.state_slots_per_request + (1 if cache.align_tokens and model.state_layers else 0)
    limit = _request_limit(plan, config, reqs, peak_slots)
    real = config.executor == "real"
    backend = _real().real_backend(config.device) if real else SimBackend()
    pool = plan.make_pool(backend, config.compaction, ids="numpy")  # host ids, no tensor per call
    memory = Memory(pool, window_tokens=model.window_tokens if model.swa_layers else None,
                    block_tokens=block, meta_tokens=model.meta_tokens,
                    state_slots_per_request=state.state_slots_per_request, align_tokens=cache.align_tokens)
    step_cost, step_time_model = cost_model.step_cost_model(model, hw, gpu)
    kv_read = KVRead(model)
    executor = _real().build_real_executor(config, memory, step_cost, kv_read) if real else None
    sim = Simulation(
        reqs, memory, step_cost=step_cost, kv_bytes=kv_read, executor=executor,
        max_running=max_running,
        prefill_tokens_per_step=config.scheduler.prefill_tokens_per_step, max_tokens=limit,
        reserve=(config.scheduler.reserve_init, config.scheduler.reserve_min,
                 config.scheduler.reserve_decay),
        check_every=config.check_every, is_oracle=config.layout == "oracle",
        progress=(lambda done: progress(done, len(reqs))) if progress else None,
    )
    sim.run()
    steps, requests = sim.recorder.steps_frame(), sim.recorder.requests_frame()
    summary = summarize(steps, requests, pool.stats())
    summary["max_request_tokens"] = limit
    summary.update(gpu=gpu, gpu_spec_source=hw_source, step_time_model=step_time_model)
    if hasattr(step_cost, "extrapolated_steps"):  # a profile: steps outside its grids, flagged
        summary["step_time_extrapolated_steps"] = step_cost.extrapolated_steps
    identity = _identity(config, df, model, plan)
    if identity["vllm"] is not None:  # whether vLLM caches prefixes of this model under these rules
        on = config.scheduler.prefix_cache and vllm_prefix_caching(model, state.mamba_cache_mode or "none")
        identity["vllm"] = {**identity["vllm"], "prefix_caching": on}
    identity["engine_rules"] = {"engine": state.engine, "state_dtype": state.state_dtype,
                                "state_slots_per_request": state.state_slots_per_request,
                                "max_running": max_running}
    # the prefix cache as applied: vLLM's mamba_cache_mode (None under another engine's rules)
    identity["prefix_cache"] = {"block_tokens": block, "mamba_cache_mode": state.mamba_cache_mode,
                                "align_tokens": cache.align_tokens}
    identity["hardware"] = hw.as_dict()  # every coefficient the run was charged at, with its provenance
    identity["executor"] = _real().executor_identity(config) if real else {"executor": "cost"}
    if real:
        summary.update(_real().executor_summary(config, executor))
    return RunResult(config, identity, steps, requests, summary, sim.violations,
                     time.perf_counter() - t0)


def load_hardware(config: RunConfig):
    """The accelerator a run is charged on: `config.gpu` (a bundled GPU),
    else `config.hardware` (a bundled name or a file).

    Raises:
        ValueError: an unknown GPU or a bad hardware file (one line, named).
    """
    return cost_model.load_gpu(config.gpu) if config.gpu else cost_model.HardwareSpec.load(config.hardware)


def _hardware(config: RunConfig, hw):
    """(spec, bundled GPU name or None, where the spec came from) of a run
    (`load_hardware`); a `hw` the caller passes wins (it keeps the config's
    name and source when it is the spec they load)."""
    name = config.gpu or config.hardware
    loaded = load_hardware(config)
    gpu = name if name in cost_model.gpu_names() else None
    if hw is None or hw == loaded:
        return loaded, gpu, spec_source(name)
    return hw, None, f"HardwareSpec {hw.name!r} passed to sim.run.run"


def _real():
    """`sim.real.executor`, imported only for a real run (it needs torch)."""
    from unikv.sim.real import executor

    return executor


def _request_limit(plan, config: RunConfig, reqs: list[Request], slots: int = 1) -> int:
    """The longest request the engine admits (`sim.fit`); with oversize="error",
    raise (before the run) unless the trace's longest request fits alone."""
    longest = max(r.prompt_tokens + r.output_tokens for r in reqs)
    chunk = config.scheduler.prefill_tokens_per_step
    fit = {"prefill_chunk_tokens": chunk, "compaction": config.compaction, "state_slots_per_request": slots}
    if config.oversize == "reject":
        return max_request_tokens(plan, longest, **fit)
    try:
        check_fits(plan, longest, **fit)
    except ContextTooLongError:
        raise  # the model's context, not the budget, is the limit (the message says so)
    except RequestTooLargeError as exc:
        limit = max_request_tokens(plan, longest, **fit)
        too_long = sum(r.prompt_tokens + r.output_tokens > limit for r in reqs)
        raise RequestTooLargeError(
            f"KV budget {config.kv_budget_gib} GiB ({config.layout}) holds at most {limit} tokens of "
            f"one request, but {too_long} request(s) of the trace need up to {longest}: {exc}; "
            "or pass oversize='reject'") from None
    return longest


def _identity(config: RunConfig, df: pd.DataFrame, model, plan) -> dict:
    return {
        "trace": str(df.attrs.get("source", config.trace)),
        "trace_slice": {f: getattr(config, f) for f in TRACE_FIELDS if f != "trace"},
        "model": model.name,
        "dtypes": {"kv_cache": model.kv_cache_dtype, "conv_state": model.conv_state_dtype,
                   "ssm_state": model.ssm_state_dtype},
        "kv_budget_bytes": plan.layout.total_bytes,
        "page_size": plan.page_size,  # vllm: vLLM's block size (config.page_size for the others)
        "vllm": plan.metadata["vllm"],  # vLLM's groups and sizing (None for other layouts)
        "layout": config.layout,
        "bands": [f"{b.name}({b.grow.value})" for b in plan.layout.bands],
        "compaction": config.compaction,
        "scheduler": config.as_dict()["scheduler"],
        "seed": config.seed,
        "unikv_version": unikv.__version__,
        "git_revision": git_revision(),
    }


# Host bytes a pool takes per page-table entry, measured with tracemalloc at
# 256 GiB (tables, id stacks, bind counts): 1.4-2.2; rounded up for margin.
POOL_HOST_BYTES_PER_ENTRY = 20


def pool_host_bytes(plan) -> int:
    """Host bytes the pool of `plan` allocates at construction (an estimate
    from its page-table entries: every token band's table spans the joint
    virtual id space, see docs/architecture.md)."""
    from unikv.layout import Unit

    token_vspace = 1 + sum(g.usable_pages for g in plan.layout if g.band.unit is Unit.TOKEN)
    entries = sum((token_vspace if g.band.unit is Unit.TOKEN else g.usable_pages + 1) + g.num_pages
                  for g in plan.layout)
    return POOL_HOST_BYTES_PER_ENTRY * entries


def host_memory_bytes() -> int | None:
    """Bytes this host can still allocate (MemAvailable), or its physical
    memory where /proc/meminfo is missing; None when neither is known."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def check_host_memory(plan, kv_budget_gib: float) -> None:
    """Refuse a budget whose simulated pool this host cannot hold, before
    anything is allocated (its page tables grow with the budget).

    Raises:
        ValueError: naming the budget, the host bytes it needs, what the
            host has, and the largest budget that fits.
    """
    need, have = pool_host_bytes(plan), host_memory_bytes()
    if have is None or need <= have:
        return
    most = kv_budget_gib * have / need
    raise ValueError(f"kv_budget_gib={kv_budget_gib!r}: simulating a pool of this budget needs about "
                     f"{need / GIB:.3g} GiB of host memory for its page tables, but this host has "
                     f"{have / GIB:.3g} GiB available; give a budget below about {most:.3g} GiB")


def write_run(result: RunResult, out_dir: Path, fmt: str = "parquet",
              extra: Callable[[Path], object] | None = None) -> Path:
    """Write steps / requests tables, summary.json and config.json into
    `out_dir`, atomically (`staged_dir`): the folder then holds this run
    only, in `fmt`, or, if writing failed, the previous run untouched.

    Args:
        fmt: "parquet" or "csv".
        extra: called with the staged folder after the tables are written
            (e.g. the figures, drawn from the files just written).

    Raises:
        ValueError: a bad `fmt` or output folder (`check_out_dir`).
        OSError: the folder cannot be written.
    """
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format={fmt!r} must be 'parquet' or 'csv'")
    with staged_dir(out_dir) as tmp:
        write_run_files(result, tmp, fmt)
        if extra is not None:
            extra(tmp)
    return Path(out_dir)


def write_run_files(result: RunResult, out_dir: Path, fmt: str = "parquet") -> Path:
    """Write the run's four files into the existing folder `out_dir` (not
    atomic: `write_run` calls it on a staged folder)."""
    out_dir = Path(out_dir)
    for name, frame in (("steps", result.steps), ("requests", result.requests)):
        if fmt == "parquet":
            frame.to_parquet(out_dir / f"{name}.parquet", index=False)
        else:
            frame.to_csv(out_dir / f"{name}.csv", index=False)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.summary.items()}
    (out_dir / "summary.json").write_text(json.dumps(
        {"identity": result.identity, "summary": clean, "wall_s": result.wall_s,
         "violations": result.violations}, indent=2))
    (out_dir / "config.json").write_text(json.dumps(result.config.as_dict(), indent=2))
    return out_dir
