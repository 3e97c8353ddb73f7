"""The real executor: each planned step is one transformers forward over the pool.

`RealExecutor` implements `unikv.sim.executor.Executor`. Per step the
driver (`sim.engine`) calls:

1. `launch(plan)`: build the forward's inputs (`sim.real.batch`), set the
   attention function's step context (`sim.real.attention.use_step`), run
   the model (its attention writes the new K/V into the pool and reads K/V
   from it), take the greedy next token of every request whose step
   produces one, and return the forward's done event (on CUDA an event
   recorded after the forward; on the CPU a sim event, fired in `done`);
2. the driver declares the forward (`Memory.begin_forward`) and the pool
   flushes while it runs: on CUDA its page moves wait for the event;
3. `duration_s(plan, moved)`: wait for the device, store the sampled
   tokens, and return the measured step time (launch to device idle: the
   batch build, the forward, the flush and its moves), or with
   `clock="cost"` the cost model's time for the same step;
4. `done(event)`: fire a sim event; nothing on CUDA (the device did it).

A model with recurrent layers (Mamba-2, short conv) runs each step as
several forwards (`state_plans`: each prefill chunk alone, then the
decoders), its requests' state gathered from their state slots before
each and scattered back after (`sim.real.state.StateBinder`); with decode
graphs the decoders' forward runs through a bucket, the gather and
scatter inside it (`sim.real.graphs`).

Generated ids are kept per request id (`generated`): a retracted request
keeps them and its readmission recomputes its prompt and all but the
newest (`sim.real.batch`); the tokens of a prompt come from
`sim.real.tokens.TokenSource`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from unikv.sim.real.batch import BlockRows, StepBatch, build_batch
from unikv.sim.real.ssd import scan_for
from unikv.sim.real.state import cache_kwarg
from unikv.sim.real.tokens import TokenSource
from unikv.sim.scheduler import StepPlan


class RealExecutor:
    """Runs each step's forward through `model`, its KV in the pool.

    Args:
        memory: the run's memory layer (its pool holds the KV; its backend
            makes the done events).
        model: a transformers causal LM whose attention implementation reads
            the step context (`sim.real.attention.register`).
        views: the `KVViews` over the pool the attention function uses.
        tokens: the prompt ids.
        bands: the token bands the model's layers store on.
        device: the model's device ("cpu", "cuda", "cuda:N").
        cost: the cost-model executor whose times the clock takes instead
            of the measured ones (None: measured).
        graphs: a `sim.real.graphs.DecodeGraphs` decode-only steps run
            through (None: every step eagerly); with a `binder`, built
            with the same binder (the decoders' `[B, 1]` forward of each
            step runs through it, their state slots passed in).
        prefill: a `sim.real.prefill.CompiledPrefill` the packed steps
            (with a prefill chunk) run through (None: eagerly); with a
            `binder`, each prefill chunk's forward with its cache
            (`CompiledPrefill.forward_state`).
        packed: a `sim.real.packed_graphs.PackedGraphs` the packed steps
            run through first (None: none); a step it takes no bucket for
            runs as without it; with a `binder`, built with the same one
            (each prefill chunk alone, padded: `sim.real.padded_chunk`).
        binder: a `sim.real.state.StateBinder` over the pool's state band
            `state_band`, for a model with recurrent layers (None: none).
    """

    def __init__(self, memory, model, views, tokens: TokenSource, *, bands, device: str = "cpu",
                 cost=None, graphs=None, prefill=None, packed=None, binder=None,
                 state_band: str | None = None) -> None:
        if packed is not None and getattr(packed, "binder", None) is not binder:
            raise ValueError("RealExecutor: packed (captured packed steps) built with another state binder than "
                             "binder; expected PackedGraphs(..., binder=binder)")
        self.mem = memory
        self.model = model
        self.views = views
        self.tokens = tokens
        self.bands = tuple(bands)
        self.device = device
        self.cuda = str(device).startswith("cuda")
        self.cost = cost
        self.graphs = graphs
        self.prefill = prefill
        self.packed = packed
        self.binder = binder
        self.fused: dict | None = None  # what `fuse_projections` fused (build_real_executor), if it ran
        self.state_band = state_band
        self.cache_kwarg = cache_kwarg(model) if binder is not None else ""
        # a Mamba-2 mixer's prefill chunk scans through sim.real.ssd (Triton SSD kernels on CUDA), not
        # transformers' broadcast products (5.17: 2-17 GB per layer at 4,096 tokens)
        self.scan = scan_for(model) if binder is not None else contextlib.nullcontext
        self.rows = BlockRows(memory.pool, self.bands, device)  # requests' virtual pages, kept on the device
        self.generated: dict[int, list[int]] = {}  # rid -> the model's tokens, in order
        self.step_s: list[float] = []  # measured seconds of each step
        self.forward_s: list[float] = []  # of which the forward (CUDA events on CUDA; wall on the CPU)
        self.decode_only: list[bool] = []  # whether each step decoded only (no prefill chunk)
        self.forward_tokens = 0  # tokens computed, prefill recomputations included
        self.warm_moves: list[int] = []  # each warm-up round's page moves (`warm_up_moves`)
        self._pending: list[tuple[tuple, Any]] = []  # (samplers, their greedy tokens) per forward
        self._t0 = 0.0
        self._marks: tuple[Any, Any] = (None, None)  # the forward's start / end (events or perf_counter)
        self.state_s: list[float] = []  # of the forward, the state gather and scatter of each step (binder)
        self._bind_marks: list[tuple[Any, Any]] = []
        self.graph_off: str | None = None  # why decode_graphs built no graphs (build_real_executor)
        self.packed_off: str | None = None  # why prefill_graphs built no packed graphs (build_real_executor)

    def warm_up(self, max_batch: int) -> None:
        """What an engine does before it serves: one eager forward of a
        page of tokens that reads and writes only the sink (so the kernels
        compile and the libraries initialise off the clock), the compiled
        packed forward's usual shapes (`CompiledPrefill.warm_up`), every
        packed graph's bucket (`PackedGraphs.warm_up`), then every decode
        graph a batch of up to `max_batch` requests can use, and on CUDA
        the page-move path (`warm_up_moves`)."""
        import torch
        from unikv.sim.real.attention import use_step
        from unikv.sim.real.prefill import sink_step

        ctx, ids, pos, keep = sink_step(self.views, self.bands, self.mem.ps, self.device)
        with torch.inference_mode(), use_step(ctx):
            self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)
        if self.prefill is not None:
            self.prefill.warm_up(self.mem.ps, self.bands,
                                 new_cache=None if self.binder is None else lambda: self.binder.before([], fresh=True))
        if self.packed is not None:
            self.packed.warm_up()
        if self.graphs is not None:
            self.graphs.capture_buckets(max_batch)
        if self.cuda:
            self.warm_moves = warm_up_moves(self.mem.pool, self.device)
            torch.cuda.synchronize(self.device)

    def launch(self, plan: StepPlan) -> Any:
        """Run `plan`'s forward; returns its done event.

        A model with recurrent state runs the plan as several forwards
        (`state_plans`): each prefill chunk alone, then the decoders as one
        `[B, 1]` batch, each with its requests' state gathered from their
        slots before and scattered back after. The forward's timing spans
        them all (from before the first to after the last)."""
        import torch

        self._t0 = time.perf_counter()
        parts = state_plans(plan) if self.binder is not None else [(plan, False)]
        batches = [(build_batch(part, self.mem.pool, self.tokens, self.generated, self.bands, self.device,
                                block_rows=self.rows), fresh) for part, fresh in parts]
        start = self._mark()
        pending = []
        for batch, fresh in batches:
            picks = None
            with torch.inference_mode():  # None: no bucket fits, run it as without graphs
                if batch.layout == "padded" and self.graphs is not None:
                    picks = self.graphs.run(batch, self._state_slots(batch) if self.binder is not None else None)
                elif batch.layout != "padded" and self.packed is not None:
                    picks = (self.packed.run(batch) if self.binder is None
                             else self.packed.run(batch, self._state_slots(batch), fresh))
            if picks is None:
                picks = self._forward(batch, fresh)
            pending.append((batch.samplers, picks))
            self.forward_tokens += batch.num_tokens
        self._marks = (start, self._mark())
        self.decode_only.append(not plan.prefill)
        self._pending = pending
        return self.mem.new_event(f"step {plan.index}")  # on CUDA: recorded after the forward

    def _mark(self) -> Any:
        """A point in the step's timeline: a CUDA event recorded on the
        current stream (read after the step's sync), or the host clock."""
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, start: Any, end: Any) -> float:
        """Seconds between two `_mark`s (read after the step's sync on CUDA)."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def _forward(self, batch: StepBatch, fresh: bool = False) -> Any:
        """The forward of `batch` (eager, or through the compiled prefill
        for a packed batch); returns the greedy token of each sampled row.
        With a state binder the batch's state is gathered from its
        requests' slots first (`fresh`: a first prefill chunk starts from
        no state) and scattered back after."""
        import torch
        from unikv.sim.real.attention import StepContext, use_step

        ctx = StepContext(views=self.views, block_tables=dict(batch.block_tables), cu_q=batch.cu_q,
                          seq_lens=batch.seq_lens, write_slots=dict(batch.write_slots), layout=batch.layout)
        keep = batch.sample_rows if batch.layout == "packed" else 0
        kwargs: dict[str, Any] = {"use_cache": False}
        slots = cache = None
        if self.binder is not None:
            slots = self._state_slots(batch)
            if self.prefill is not None and batch.layout == "packed":  # a prefill chunk: compiled, with its cache
                return self._prefill_state(ctx, batch, keep, slots, fresh)
            cache = self._bind(slots, fresh)
            kwargs = {"use_cache": True, self.cache_kwarg: cache}
        if self.prefill is not None and batch.layout == "packed":  # no binder: kwargs hold no cache
            out = self.prefill.forward(ctx, batch.input_ids, batch.position_ids, keep)
            return out.logits[0].argmax(-1)
        with torch.inference_mode(), use_step(ctx), self.scan():
            out = self.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                             logits_to_keep=keep, **kwargs)
            if cache is not None:
                self._unbind(cache, slots)
        # packed: logits [1, S, V] at the sampled rows; padded: [B, 1, V], every row samples
        logits = out.logits[0] if batch.layout == "packed" else out.logits[:, -1]
        return logits.argmax(-1)

    def _bind(self, slots, fresh: bool) -> Any:
        """The binder's cache for `slots` (`StateBinder.before`), timed."""
        start = self._mark()
        cache = self.binder.before(slots, fresh=fresh)
        self._bind_marks.append((start, self._mark()))
        return cache

    def _unbind(self, cache, slots) -> None:
        """The state `cache` holds back into `slots` (`StateBinder.after`), timed."""
        start = self._mark()
        self.binder.after(cache, slots)
        self._bind_marks.append((start, self._mark()))

    def _prefill_state(self, ctx, batch: StepBatch, keep, slots, fresh: bool) -> Any:
        """One request's prefill chunk through the compiled prefill with
        the binder's cache (`CompiledPrefill.forward_state`: a failed
        compiled forward re-binds and runs eagerly), its state scattered
        back after; the greedy pick of each sampled row."""
        import torch

        out, cache = self.prefill.forward_state(ctx, batch.input_ids, batch.position_ids, keep,
                                                bind=lambda: self._bind(slots, fresh))
        with torch.inference_mode():
            self._unbind(cache, slots)
        return out.logits[0].argmax(-1)

    def _state_slots(self, batch: StepBatch) -> Any:
        """The physical state slots of `batch`'s requests (host), in batch order."""
        return self.mem.pool.translate(_state_ids(batch.requests), self.state_band)

    def duration_s(self, plan: StepPlan, moved_bytes: int) -> float:
        """Wait for the step, keep its tokens; its seconds (measured, or the
        cost model's with a cost clock)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)  # the forward and the flush's moves
        measured = time.perf_counter() - self._t0
        self.step_s.append(measured)
        start, end = self._marks
        if start is not None:
            self.forward_s.append(self._seconds(start, end))
            self._marks = (None, None)
        if self.binder is not None:
            self.state_s.append(sum(self._seconds(a, b) for a, b in self._bind_marks))
            self._bind_marks = []
        for samplers, picks in self._pending:
            for r, t in zip(samplers, picks.tolist()):
                self.generated.setdefault(r.rid, []).append(int(t))
        self._pending = []
        if self.cost is not None:
            return self.cost.duration_s(plan, moved_bytes)
        return measured

    def done(self, event: Any) -> None:
        """The step's time has passed: fire a sim event (a CUDA event fired on the device)."""
        fire = getattr(event, "fire", None)
        if fire is not None:  # a sim event: nothing fires it but us
            fire()


def state_plans(plan: StepPlan) -> list[tuple[StepPlan, bool]]:
    """`plan` as the forwards a model with recurrent state runs: each
    prefill chunk alone (transformers' Mamba-2 and short-conv layers do not
    separate packed sequences: a conv would mix one request's tokens into
    the next's), then every decoder in one `[B, 1]` batch.

    Returns:
        (sub-plan, fresh) in batch order; `fresh`: the chunk starts the
        request at position 0 (a first chunk, or a readmission's first:
        its state slot holds nothing of it yet).
    """
    out = [(dataclasses.replace(plan, prefill=[(r, n)], decode=[], prefill_tokens=n), r.seq - n == 0)
           for r, n in plan.prefill]
    if plan.decode:
        out.append((dataclasses.replace(plan, prefill=[], decode=list(plan.decode), prefill_tokens=0), False))
    return out


def _state_ids(requests) -> list[int]:
    """The state slot ids (`Request.state`) of `requests`, in order.

    Raises:
        ValueError: a request holds no state slot.
    """
    ids = [r.state for r in requests]
    if any(s is None for s in ids):
        raise ValueError(f"requests {[r.rid for r in requests if r.state is None]} hold no state slot: the "
                         "memory layer allocates one per running request of a recurrent model")
    return ids


# -- building a real run (sim.run calls these for executor="real") --

COMPILE_BACKEND = "inductor"
"""`torch.compile`'s backend for the compiled decode and packed steps
(the CPU tests set "aot_eager": inductor's C++ code takes minutes there)."""


WARM_PAGES = (2, 4, 8, 34, 62, 66)
"""Pages each round of `warm_up_moves` allocates before freeing every other
one, so that its flushes move from one page to dozens (a single page, and
counts that are and are not multiples of 16: Triton compiles a kernel apart
for an integer argument of 1 and for multiples of 16)."""


def warm_up_moves(pool, device: str) -> list[int]:
    """Run the page-move path before the clock, as an engine's start-up runs
    its kernels once: on a scratch `UnifiedPool` of `pool`'s bands and
    compaction mode on `device` (the same page bytes, so the same copy
    kernels and tiling), rounds of WARM_PAGES single-page allocations on
    every band, every other one freed, an urgent flush (the lazy pool's
    full pack; an eager pool moves at the frees), then the rest freed.
    `pool` is not touched: its tables, bytes and counters stay as they were.
    Returns each round's moves ([] for a pool that never moves a page: a
    baseline's fixed split, the oracle, vLLM's block pool).

    Why: the validation's real replays (results/validation/h200) had decode
    steps of 99-414 ms, all of them early among the steps that moved pages,
    and none in the layouts that move none; the warm-up had run no move.

    Raises:
        RuntimeError: the scratch pool fails its own `verify()`.
    """
    import numpy as np
    import torch

    from unikv import Layout, UnifiedPool
    from unikv.backends import CudaBackend

    if type(pool) is not UnifiedPool:  # the baselines' pools (fixed split, oracle, vLLM's) never move a page
        return []
    layout = pool.layout
    page_bytes = sum(b.entry_bytes * b.page_size for b in layout.bands)
    total = min(layout.total_bytes, layout.sink_bytes + 2 * (max(WARM_PAGES) + 2) * page_bytes)
    scratch = UnifiedPool(Layout(total_bytes=total, bands=list(layout.bands)), backend=CudaBackend(device),
                          compaction=pool.compaction)
    ps, states = layout.page_size, [b.name for b in layout.state_bands]
    moves = []
    for pages in WARM_PAGES:
        before = scratch.stats()["moves"]
        held = [(None, scratch.alloc(ps)) for _ in range(pages if layout.token_bands else 0)]
        held += [(name, scratch.alloc_state(name, 1)) for name in states for _ in range(pages)]
        for first in (0, 1):  # every other one in one free per band, flushed (the moves counted); then the rest
            for band in (None, *states):
                ids = [i for b, i in held[first::2] if b == band and i is not None]
                if not ids:
                    continue
                ids = torch.cat(ids) if isinstance(ids[0], torch.Tensor) else np.concatenate(ids)  # as alloc gave
                if band is None:
                    scratch.free(ids)
                else:
                    scratch.free_state(band, ids)
            scratch.flush(urgent=True)
            if first == 0:
                moves.append(scratch.stats()["moves"] - before)
    problems = scratch.verify()
    if problems:
        raise RuntimeError(f"warm_up_moves: the scratch pool broke: {problems[:3]}")
    del scratch
    if str(device).startswith("cuda"):  # its bytes back to the device, not kept by the caching allocator
        torch.cuda.empty_cache()
    return moves


def real_backend(device: str):
    """The pool backend of a real run: the sim backend with real bytes on
    the CPU (the KV views read its numpy buffer), the CUDA backend on a GPU.

    Raises:
        ValueError: torch or transformers missing, or a CUDA device on a
            machine without CUDA.
    """
    try:
        import torch
        import transformers  # noqa: F401  (the model is built with it)
    except ImportError as exc:
        raise ValueError(f"executor='real' needs torch and transformers ({exc})") from None
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available on this machine")
        from unikv.backends import CudaBackend

        return CudaBackend(device)
    from unikv.backends import SimBackend

    return SimBackend(materialize=True)


def build_real_executor(config, memory, step_cost, kv_read) -> RealExecutor:
    """The real executor of `config` over `memory`'s pool: the model built
    from the config's config.json (`sim.real.model`), its layers placed on
    the pool's bands (`sim.real.layers`), the KV views, the attention
    function registered; with `real_clock="cost"`, the cost model's times.

    Raises:
        ValueError: a config transformers cannot build, layers that cannot
            be placed, a layout the KV views cannot view (named), bad weights.
    """
    from unikv.sim.executor import CostModelExecutor
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model

    from unikv.tensors import KVViews

    pool = memory.pool
    if config.weights is not None:
        real_model.check_weights(config.weights)  # before the build: a bad folder fails fast
    path = real_model.config_path(config.model)
    dtype = config.dtype or config.kv_cache_dtype
    lm = real_model.build_model(path, dtype=dtype, device=config.device, weights=config.weights,
                                seed=config.seed)
    # a layout that folds the window layers into the full band (SGLang's, `sim.sglang.deployed_model`)
    # keeps their KV there: the attention still applies the window
    folded = "swa" not in {b.name for b in pool.layout.token_bands}
    placed = layers.model_layers(lm.config, real_model.torch_dtype(dtype),
                                 bands={"sliding": "full"} if folded else None)
    try:
        binder = _state_binder(lm, placed, memory)
    except ValueError as exc:
        raise ValueError(f"model={config.model!r}: {exc}") from None
    if not folded and placed.window_tokens != memory.window:
        raise ValueError(f"model={config.model!r}: the model slides over {placed.window_tokens} tokens, the "
                         f"layout's window band over {memory.window}")
    try:
        layers.check_layout(placed, pool.layout)
        views = KVViews(pool, placed.kv)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"layout={config.layout!r}: the real executor cannot view this pool ({exc})") from None
    # a graph capture may not read the device: no mask preprocessing then (attention.register)
    lm.set_attn_implementation(attention.register(mask=not (config.decode_graphs or config.prefill_graphs)))
    fused = None
    if config.compile_decode or config.compile_prefill:  # as engines hold them: one matmul per group, every step
        from unikv.sim.real.fuse import fuse_projections

        fused = fuse_projections(lm)
    bands = sorted({s.band for s in placed.kv})
    block = memory.cache.block_tokens if memory.cache is not None else None
    tokens = TokenSource(vocab_size=int(lm.config.vocab_size), block_tokens=block, seed=config.seed)
    cost = CostModelExecutor(memory, step_cost, kv_read) if config.real_clock == "cost" else None
    graphs = prefill = graph_off = None
    if config.decode_graphs:  # with a binder: the state's gather and scatter run inside each bucket
        from unikv.sim.real.graphs import DecodeGraphs

        try:
            graphs = DecodeGraphs(lm, views, bands, device=config.device, max_pages=_max_pages(lm.config, memory),
                                  compile=config.compile_decode, compile_backend=COMPILE_BACKEND, binder=binder)
        except ValueError as exc:  # a forward a capture cannot take: eager decode, the summary says why
            graph_off = str(exc)
    if config.compile_prefill:  # with a binder: each prefill chunk's forward, with its cache
        from unikv.sim.real.prefill import CompiledPrefill

        prefill = CompiledPrefill(lm, views, device=config.device, backend=COMPILE_BACKEND)
    packed = packed_off = None
    if config.prefill_graphs:  # with a binder: each prefill chunk alone, padded (sim.real.padded_chunk)
        from unikv.sim.real.packed_graphs import PackedGraphs

        try:
            packed = PackedGraphs(lm, views, bands, device=config.device, max_pages=_max_pages(lm.config, memory),
                                  max_requests=config.scheduler.max_running, prefill=prefill, binder=binder)
        except ValueError as exc:  # recurrent layers without a padded path: their chunks run uncaptured
            packed_off = str(exc)
    executor = RealExecutor(memory, lm, views, tokens, bands=bands, device=config.device, cost=cost, graphs=graphs,
                            prefill=prefill, packed=packed, binder=binder,
                            state_band=memory.state_band if binder is not None else None)
    executor.fused = fused
    executor.graph_off = graph_off
    executor.packed_off = packed_off
    if executor.cuda and config.real_clock == "measured":  # start-up work an engine does before its clock runs
        executor.warm_up(config.scheduler.max_running)
    return executor


def _state_binder(lm, placed, memory):
    """The `StateBinder` of a model with recurrent layers over the memory
    layer's state band (None for an attention-only model).

    Raises:
        ValueError: one line: recurrent layers it cannot bind (named by
            type, `layers.check_recurrent`), a layout without a state band,
            a state band of another size, or a prefix cache (its blocks'
            state slots hold their request's final state, not the state at
            the block's end: a hit would resume from the wrong state).
    """
    from unikv.sim.real import layers
    from unikv.sim.real.state import StateBinder, pool_state_views, recurrent_layers

    if not placed.recurrent:
        return None
    try:
        bound = tuple(g.layer for g in recurrent_layers(lm))
    except ValueError:
        bound = ()
    layers.check_recurrent(placed, lm.config, bound=bound)
    if memory.state_band is None:
        raise ValueError(f"layers {list(placed.recurrent)} keep recurrent state; the layout has no state band")
    if memory.cache is not None:
        raise ValueError("prefix_cache: a cached block's state slot holds its request's final state, not the "
                         "state at the block's end, so a hit would resume a recurrent model from the wrong "
                         "state; expected --no-prefix-cache (prefix_cache=False) with recurrent layers")
    return StateBinder(lm, pool_state_views(lm, memory.pool, memory.state_band))


def _max_pages(hf_config, memory) -> int:
    """The most pages one request can hold: the model's context or the
    pool's token capacity, whichever is smaller."""
    capacity = memory.pool.layout.total_bytes // memory.token_entry_bytes
    tokens = min(int(getattr(hf_config, "max_position_embeddings", capacity) or capacity), capacity)
    return -(-tokens // memory.ps) + 1


def non_forward_summary(executor: RealExecutor) -> dict:
    """The measured step time outside the forward (batch build, flush and
    its moves, the sampled tokens' read-back; the cost model's
    `non_forward_s`): median seconds over decode-only steps, over steps
    with a prefill chunk, and over all steps (None where there were none)."""
    import statistics

    rest = [s - f for s, f in zip(executor.step_s, executor.forward_s)]
    kinds = list(zip(rest, executor.decode_only))

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {"real_non_forward_s_median": median(rest),
            "real_non_forward_s_decode_median": median([r for r, d in kinds if d]),
            "real_non_forward_s_prefill_median": median([r for r, d in kinds if not d])}


def executor_identity(config) -> dict:
    """What ran the steps, for the run's identity (summary.json)."""
    return {"executor": config.executor, "device": config.device,
            "dtype": config.dtype or config.kv_cache_dtype,
            "weights": config.weights or f"random (seed {config.seed})", "real_clock": config.real_clock,
            "decode_graphs": config.decode_graphs, "compile_decode": config.compile_decode,
            **({"compile_prefill": True} if config.compile_prefill else {}),
            **({"prefill_graphs": True} if config.prefill_graphs else {})}


def executor_summary(config, executor: RealExecutor) -> dict:
    """The real run's summary fields: the executor's identity and what it
    measured (seconds per step, tokens computed)."""
    steps = executor.step_s
    out = executor_identity(config)
    out.update({"real_steps": len(steps), "real_step_s_mean": sum(steps) / len(steps) if steps else None,
                "real_step_s_total": sum(steps), "real_forward_tokens": executor.forward_tokens,
                "real_forward_s_total": sum(executor.forward_s)})
    out.update(non_forward_summary(executor))
    if executor.binder is not None:  # what binding the recurrent state to the pool's slots costs
        out.update(real_state_s_total=sum(executor.state_s),
                   real_state_share_of_forward=sum(executor.state_s) / max(sum(executor.forward_s), 1e-12))
    if config.decode_graphs and executor.graphs is None:
        out["graph_off"] = f"decode runs eagerly: {executor.graph_off}"
    if executor.graphs is not None:
        stats = executor.graphs.stats()
        out.update(graph_steps=stats["steps"], graph_buckets=stats["buckets"], graph_captured=stats["captured"],
                   graph_capture_failures={str(k): v for k, v in stats["failures"].items()})
        if "state" in stats:  # a recurrent model: its decode state updated in slot, or gathered and scattered
            out["graph_state"] = stats["state"]
        if config.compile_decode:
            out.update(graph_compiled=stats["compiled"],
                       graph_compile_failures={str(k): v for k, v in stats["compile_failures"].items()})
    if config.compile_prefill:
        out.update(prefill_summary(executor))
    if config.prefill_graphs:
        out.update(packed_graph_summary(executor))
    if executor.fused is not None:
        out["fused_projections"] = executor.fused
    if executor.warm_moves:
        out["warm_up_moves"] = list(executor.warm_moves)
    return out


def prefill_summary(executor: RealExecutor) -> dict:
    """Whether the packed steps (with a prefill chunk) ran compiled: steps
    (with recurrent state: prefill chunks, one forward each) run compiled
    and eagerly, forwards that compiled a new graph and the
    graphs they made (the recompiles of the run), their seconds, and why
    the compiled forward stopped or never ran (None: it never failed)."""
    if executor.prefill is None:
        packed = executor.decode_only.count(False)
        return {"prefill_compiled_steps": 0, "prefill_eager_steps": packed, "prefill_compiles": 0,
                "prefill_graphs": 0, "prefill_compile_s": 0.0,
                "prefill_compile_failure": "no compiled prefill was built: the packed steps ran eagerly"}
    # with a state binder the counts are of forwards (each prefill chunk alone), not of steps
    s = executor.prefill.stats()
    return {"prefill_compiled_steps": s["compiled_steps"], "prefill_eager_steps": s["eager_steps"],
            "prefill_compiles": s["compiles"], "prefill_graphs": s["graphs"], "prefill_compile_s": s["compile_s"],
            "prefill_compile_failure": s["failure"]}


def packed_graph_summary(executor: RealExecutor) -> dict:
    """How the packed steps (with a prefill chunk) ran through the
    per-token-bucket graphs: steps run captured, through a bucket's
    buffers uncaptured (the CPU, or a failed capture), and outside the
    buckets; the buckets built and captured; why a capture failed; with
    the compiled prefill, the buckets run compiled and why one was not."""
    if executor.packed is None:
        packed = executor.decode_only.count(False)
        return {"packed_graph_steps_captured": 0, "packed_graph_steps_uncaptured": 0,
                "packed_graph_fallbacks": packed, "packed_graph_buckets": [], "packed_graph_captured": [],
                "packed_graph_capture_failures": {},
                "packed_graph_off": executor.packed_off
                or "no packed graphs were built: the packed steps ran uncaptured"}
    s = executor.packed.stats()
    out = {"packed_graph_steps_captured": s["steps_captured"], "packed_graph_steps_uncaptured": s["steps_uncaptured"],
           "packed_graph_fallbacks": s["fallbacks"], "packed_graph_buckets": s["buckets"],
           "packed_graph_captured": s["captured"],
           "packed_graph_capture_failures": {str(k): v for k, v in s["failures"].items()}}
    if "compiled" in s:
        out.update(packed_graph_compiled=s["compiled"],
                   packed_graph_compile_failures={str(k): v for k, v in s["compile_failures"].items()})
    return out
