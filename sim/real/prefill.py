"""Prefill and mixed steps through compiled decoder layers (issue 17 items 2-3).

A step with a prefill chunk is one packed `[1, T]` forward (its chunks,
then its decoders). Eager, each decoder layer launches some 15-20 small
kernels (norms, rotary, activations, residual adds, casts), each costing
host time, so a small chunk's step is bound by launches, not by the GPU.
`CompiledPrefill` runs the packed forward with the decoder layers compiled
as the decode graphs compile them (`sim.real.graphs.CompiledLayers`: one
`torch.compile` per layer class, inductor's default mode, the attention
and the KV write one opaque operator, `StepContext(opaque=True)`); the
embedding, the rotary tables, the final norm and the head stay eager.

The step's sizes are no constants of the graphs, so one compiled graph per
layer kind serves every chunk size. The tokens T (dimension 1 of the
hidden states, positions and rotary tables; the write slots) are marked
dynamic; dynamo still specialises T = 1 (a step of one token), so that
one graph more per layer kind. The requests B (`cu_q`, `seq_lens`, the
block tables' rows) and the tables' width W are marked unbacked: only the
opaque operator reads them, so no guard needs their values and a size of
1 (one request, a one-page table) is not specialised; marked dynamic, it
would be, and dynamo's duck sizing would tie sizes that happened to be
equal at the first compile (docs/real_executor.md). `stats()` counts
the compiles; past RECOMPILE_LIMIT compiles of a layer class dynamo raises
instead of running uncompiled. `warm_up` compiles both token classes
before a run's clock.

A compiled forward that raises (a compile error, the limit) is recorded
and that step, and every later one, runs the eager forward. Re-running the
step eagerly is exact: each layer writes its K / V at the step's slots
before its attention reads them, so whatever the failed forward's first
layers wrote is written again, by the eager layers, before any read.

A model with recurrent state (Nemotron-H, LFM2) runs each prefill chunk as
its own `[1, T]` forward with the state binder's transformers cache
(`forward_state`); its layers compile as `CompiledLayers` compiles a
hybrid's blocks (`sim.real.hybrid`), one graph per block kind for every
chunk size, a first chunk and a continuing one apart. A failed compiled
forward may have updated the state of the layers before the failure in
the cache, so its eager re-run starts from a new cache gathered from the
pool's slots again (the slots are written only after the forward).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from unikv.sim.real.graphs import RECOMPILE_LIMIT, CompiledLayers, compile_error, mark_caches_dynamic


class CompiledPrefill:
    """Packed (prefill and mixed) forwards through compiled decoder layers.

    Args:
        model: the causal LM (attention implementation "unikv").
        views: the pool's `KVViews`.
        device: the model's device.
        backend, mode: `torch.compile`'s (see `DecodeGraphs`): "aot_eager"
            traces without generating code, a check on the CPU.
    Raises:
        ValueError: a compile mode that captures CUDA graphs itself
            ("reduce-overhead", "max-autotune"): a packed step's sizes
            change every step.
    """

    def __init__(self, model, views, *, device: str, backend: Any = "inductor", mode: str | None = None) -> None:
        if mode in ("reduce-overhead", "max-autotune"):
            raise ValueError(f"CompiledPrefill: mode={mode!r} captures CUDA graphs itself; expected None, "
                             "'default' or 'max-autotune-no-cudagraphs'")
        from unikv.kernels.attention.op import attention_op

        self.model = model
        self.views = views
        self.device = device
        self.cuda = str(device).startswith("cuda")
        self.compiled_steps = 0  # packed forwards run compiled
        self.eager_steps = 0  # packed forwards run eagerly (after a failure)
        self.compiles = 0  # compiled forwards that compiled at least one new graph
        self.graphs = 0  # graphs those compiles made (dynamo's unique graphs)
        self.compile_s = 0.0  # seconds of those forwards
        self.failure: str | None = None  # why the compiled forward stopped (None: it never failed)
        self._layers: CompiledLayers | None = None
        self._scan: Any = contextlib.nullcontext
        self._cache_kwarg = "cache"
        attention_op()  # registered before dynamo traces a caller: dynamo cannot trace the registration
        try:
            self._layers = CompiledLayers(model, backend=backend, mode=mode)
        except ValueError as exc:
            self.failure = f"ValueError: {exc}"
            return
        if self._layers.hybrid:  # the binder's cache, and sim.real.ssd's scan for a Mamba-2 mixer's chunks
            from unikv.sim.real.ssd import scan_for
            from unikv.sim.real.state import cache_kwarg

            self._scan, self._cache_kwarg = scan_for(model), cache_kwarg(model)
        mark_caches_dynamic(views)

    def forward(self, ctx, input_ids, position_ids, logits_to_keep) -> Any:
        """The packed forward's output (`.logits` at `logits_to_keep`):
        compiled, or eager once a compiled forward has failed.

        Args:
            ctx: the step (`StepContext`, layout "packed", not opaque).
            input_ids, position_ids: `[1, T]` int64.
            logits_to_keep: the rows whose logits are kept (transformers').
        """
        return self._run(ctx, input_ids, position_ids, logits_to_keep, lambda: None)[0]

    def forward_state(self, ctx, input_ids, position_ids, logits_to_keep, bind: Callable[[], Any]) -> tuple:
        """One request's prefill chunk of a model with recurrent state:
        `forward` with a transformers cache the forward reads and updates.

        Args:
            bind: gives the cache (the state binder's, gathered from the
                request's slot, or empty for a first chunk); called once,
                and once more for the eager re-run of a compiled forward
                that failed (module docstring).
        Returns:
            (the output, the cache the forward that ran updated).
        """
        return self._run(ctx, input_ids, position_ids, logits_to_keep, bind)

    def _run(self, ctx, input_ids, position_ids, keep, bind: Callable[[], Any]) -> tuple:
        """(the output, the cache `bind` gave it): compiled, or eager once a
        compiled forward has failed; the eager re-run of a failed one gets
        a new cache from `bind` (None: the forward passes none)."""
        cache = bind()
        if self._layers is not None and self.failure is None:
            try:
                out = self._compiled(ctx, input_ids, position_ids, keep, self._with(cache))
            except Exception as exc:  # any compiler error: this step and the later ones eagerly, recorded
                self.failure = compile_error(exc)
                cache = bind()
            else:
                self.compiled_steps += 1
                return out, cache
        self.eager_steps += 1
        return self._eager(ctx, input_ids, position_ids, keep, self._with(cache)), cache

    def _with(self, cache) -> dict:
        """The forward's keywords that pass `cache` (None: no cache)."""
        return {"use_cache": False} if cache is None else {"use_cache": True, self._cache_kwarg: cache}

    def _eager(self, ctx, input_ids, position_ids, keep, kwargs: dict) -> Any:
        import torch
        from unikv.sim.real.attention import use_step

        with torch.inference_mode(), use_step(ctx), self._scan():
            return self.model(input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep, **kwargs)

    def _compiled(self, ctx, input_ids, position_ids, keep, kwargs: dict) -> Any:
        """The forward through the compiled layers; a forward that compiles
        a new graph is counted and timed (`compiles`, `graphs`, `compile_s`)."""
        import torch
        from torch._dynamo.utils import counters

        assert self._layers is not None
        tokens = int(input_ids.shape[1])
        mark_step_dynamic(ctx)
        ctx = dataclasses.replace(ctx, opaque=True)
        before = counters["stats"]["unique_graphs"]
        t0 = time.perf_counter()
        # inference mode always: the graphs were compiled under it (another grad mode would recompile)
        with torch.inference_mode(), self._layers.active(self.views, tokens, dim=1), torch._dynamo.config.patch(
                recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True), self._scan():
            out = self.model(input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep, unikv_step=ctx,
                             **kwargs)
        new = counters["stats"]["unique_graphs"] - before
        if new:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.compiles += 1
            self.graphs += new
            self.compile_s += time.perf_counter() - t0
        return out

    def warm_up(self, page_size: int, bands: Sequence[str], new_cache: Callable[[], Any] | None = None) -> None:
        """Compile both token classes before the clock runs: a one-request
        step of two pages of tokens, then one of one token, each reading
        and writing only the pool's sink (tables, slots: 0). With
        `new_cache` (a model with recurrent state; gives an empty cache):
        a first chunk of two pages, then continuing chunks of two pages
        and of one token in the state it left; the cache is dropped after,
        so no state slot is written."""
        if new_cache is None:
            for tokens in (2 * page_size, 1):
                self.forward(*sink_step(self.views, bands, page_size, self.device, tokens=tokens))
            return
        cache = new_cache()
        for tokens in (2 * page_size, 2 * page_size, 1):
            cache = self.forward_state(*sink_step(self.views, bands, page_size, self.device, tokens=tokens),
                                       bind=lambda c=cache: c)[1]

    def stats(self) -> dict:
        """Packed forwards run compiled and eagerly, the forwards that
        compiled a new graph, the graphs compiled, their seconds, and why
        the compiled forward stopped (None: it never failed)."""
        return {"compiled_steps": self.compiled_steps, "eager_steps": self.eager_steps, "compiles": self.compiles,
                "graphs": self.graphs, "compile_s": self.compile_s, "failure": self.failure}


def mark_step_dynamic(ctx) -> None:
    """Mark the sizes of a packed step's tensors: the requests (`cu_q`,
    `seq_lens`, the tables' rows) and the tables' width unbacked, the
    tokens written (the slots) dynamic (see the module docstring)."""
    import torch

    torch._dynamo.decorators.mark_unbacked(ctx.cu_q, 0)
    torch._dynamo.decorators.mark_unbacked(ctx.seq_lens, 0)
    for table in ctx.block_tables.values():
        torch._dynamo.decorators.mark_unbacked(table, 0)
        torch._dynamo.decorators.mark_unbacked(table, 1)
    for slots in ctx.write_slots.values():
        torch._dynamo.maybe_mark_dynamic(slots, 0)


def sink_step(views, bands: Sequence[str], page_size: int, device: str, *, tokens: int | None = None) -> tuple:
    """A packed step of one request's last `tokens` tokens (default: a
    page's) that reads and writes only the pool's sink: its table holds
    page 0 as often as its KV needs pages, every write goes to slot 0.

    Returns:
        (ctx, input_ids, position_ids, logits_to_keep), `forward`'s arguments.
    Raises:
        ValueError: `tokens` < 1.
    """
    import torch
    from unikv.sim.real.attention import StepContext

    tokens = page_size if tokens is None else tokens
    if tokens < 1:
        raise ValueError(f"sink_step: tokens={tokens}; expected at least 1")
    seq = max(tokens, page_size)  # the KV ends a page or more in
    ctx = StepContext(views=views,
                      block_tables={b: torch.zeros((1, -(-seq // page_size)), dtype=torch.int32, device=device)
                                    for b in bands},
                      cu_q=torch.tensor([0, tokens], dtype=torch.int32, device=device),
                      seq_lens=torch.tensor([seq], dtype=torch.int32, device=device),
                      write_slots={b: torch.zeros(tokens, dtype=torch.int64, device=device) for b in bands},
                      layout="packed")
    return (ctx, torch.zeros((1, tokens), dtype=torch.int64, device=device),
            torch.arange(seq - tokens, seq, dtype=torch.int64, device=device).view(1, tokens),
            torch.tensor([tokens - 1], device=device))
