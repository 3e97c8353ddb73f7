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

The step's sizes are marked dynamic: the tokens T (dimension 1 of the
hidden states, positions and rotary tables; the write slots), the requests
B (`cu_q`, `seq_lens`, the block tables' rows) and the block tables' width
W, so one compiled graph per layer kind serves every chunk size. Dynamo
still specialises a size of 1 (one request, a table one page wide, a step
of one token): a replay compiles at most one graph per layer kind for each
combination of those it meets, and `stats()` counts them; past
RECOMPILE_LIMIT compiles of a layer class dynamo raises instead of running
uncompiled. `warm_up` compiles the usual classes before a run's clock.

A compiled forward that raises (a compile error, the limit) is recorded
and that step, and every later one, runs the eager forward. Re-running the
step eagerly is exact: each layer writes its K / V at the step's slots
before its attention reads them, so whatever the failed forward's first
layers wrote is written again, by the eager layers, before any read.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from unikv.sim.real.graphs import RECOMPILE_LIMIT, CompiledLayers, compile_error, mark_caches_dynamic

WARM_SHAPES = ((1, 1), (1, 2), (2, 2))
"""(requests, table width in pages) of the sink-only steps `warm_up` runs:
one chunk on one page, one chunk over two pages, a chunk and a decoder."""


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
        attention_op()  # registered before dynamo traces a caller: dynamo cannot trace the registration
        try:
            self._layers = CompiledLayers(model, backend=backend, mode=mode)
        except ValueError as exc:
            self.failure = f"ValueError: {exc}"
            return
        mark_caches_dynamic(views)

    def forward(self, ctx, input_ids, position_ids, logits_to_keep) -> Any:
        """The packed forward's output (`.logits` at `logits_to_keep`):
        compiled, or eager once a compiled forward has failed.

        Args:
            ctx: the step (`StepContext`, layout "packed", not opaque).
            input_ids, position_ids: `[1, T]` int64.
            logits_to_keep: the rows whose logits are kept (transformers').
        """
        if self._layers is not None and self.failure is None:
            try:
                out = self._compiled(ctx, input_ids, position_ids, logits_to_keep)
            except Exception as exc:  # any compiler error: this step and the later ones eagerly, recorded
                self.failure = compile_error(exc)
            else:
                self.compiled_steps += 1
                return out
        self.eager_steps += 1
        return self._eager(ctx, input_ids, position_ids, logits_to_keep)

    def _eager(self, ctx, input_ids, position_ids, keep) -> Any:
        import torch
        from unikv.sim.real.attention import use_step

        with torch.inference_mode(), use_step(ctx):
            return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=keep)

    def _compiled(self, ctx, input_ids, position_ids, keep) -> Any:
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
                recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                             logits_to_keep=keep, unikv_step=ctx)
        new = counters["stats"]["unique_graphs"] - before
        if new:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.compiles += 1
            self.graphs += new
            self.compile_s += time.perf_counter() - t0
        return out

    def warm_up(self, page_size: int, bands: Sequence[str]) -> None:
        """Compile the usual shape classes before the clock runs: a packed
        step of one page of tokens per WARM_SHAPES entry, reading and
        writing only the pool's sink (tables, slots: 0)."""
        for requests, width in WARM_SHAPES:
            self.forward(*sink_step(self.views, bands, page_size, self.device, requests=requests, width=width))

    def stats(self) -> dict:
        """Packed forwards run compiled and eagerly, the forwards that
        compiled a new graph, the graphs compiled, their seconds, and why
        the compiled forward stopped (None: it never failed)."""
        return {"compiled_steps": self.compiled_steps, "eager_steps": self.eager_steps, "compiles": self.compiles,
                "graphs": self.graphs, "compile_s": self.compile_s, "failure": self.failure}


def mark_step_dynamic(ctx) -> None:
    """Mark the sizes of a packed step's tensors dynamic: the requests
    (`cu_q`, `seq_lens`, the tables' rows), the tables' width and the
    tokens written (the slots)."""
    import torch

    torch._dynamo.maybe_mark_dynamic(ctx.cu_q, 0)
    torch._dynamo.maybe_mark_dynamic(ctx.seq_lens, 0)
    for table in ctx.block_tables.values():
        torch._dynamo.maybe_mark_dynamic(table, 0)
        torch._dynamo.maybe_mark_dynamic(table, 1)
    for slots in ctx.write_slots.values():
        torch._dynamo.maybe_mark_dynamic(slots, 0)


def sink_step(views, bands: Sequence[str], page_size: int, device: str, *, requests: int = 1,
              width: int = 1) -> tuple:
    """A packed step of `page_size` tokens that reads and writes only the
    pool's sink: `requests` requests (the last one's chunk takes what the
    others' one token each leave), tables `width` pages wide of page 0,
    every write at slot 0; each request's KV ends at `page_size` tokens.

    Returns:
        (ctx, input_ids, position_ids, logits_to_keep), `forward`'s arguments.
    Raises:
        ValueError: `requests` outside [1, page_size] or `width` < 1.
    """
    import torch
    from unikv.sim.real.attention import StepContext

    if not 1 <= requests <= page_size or width < 1:
        raise ValueError(f"sink_step: requests={requests}, width={width}; expected 1 <= requests <= "
                         f"page_size={page_size} and width >= 1")
    q_lens = [1] * (requests - 1) + [page_size - requests + 1]
    positions = [page_size - 1] * (requests - 1) + list(range(requests - 1, page_size))
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    ctx = StepContext(views=views,
                      block_tables={b: torch.zeros((requests, width), dtype=torch.int32, device=device) for b in bands},
                      cu_q=torch.tensor(cu, dtype=torch.int32, device=device),
                      seq_lens=torch.full((requests,), page_size, dtype=torch.int32, device=device),
                      write_slots={b: torch.zeros(page_size, dtype=torch.int64, device=device) for b in bands},
                      layout="packed")
    return (ctx, torch.zeros((1, page_size), dtype=torch.int64, device=device),
            torch.tensor([positions], dtype=torch.int64, device=device),
            torch.tensor([c - 1 for c in cu[1:]], device=device))
