"""The decode step as a CUDA graph per batch-size bucket (issue 16 item 6).

A decode-only step (padded `[B, 1]` inputs) runs the same kernels every
step; only the data changes: token ids, positions, KV lengths, the
requests' virtual page rows and the virtual ids written. `DecodeGraphs`
keeps, per bucket of batch sizes, static buffers of the bucket's size that
the forward reads, captures the forward once over them (`torch.cuda.graph`,
after a warm-up on a side stream as PyTorch's `torch.cuda.graphs`
documentation asks), and per step copies the step's batch into them and
replays the graph. The graph starts by translating the virtual rows and ids
to physical pages and slots, one gather per band from the pool's device
page tables (`KVViews.translate_pages` / `translate_slots`), so a page move
between steps changes only the tables the gather reads. Rows past the
step's B are padding: token 0 at position 0, KV length 1, virtual row 0 and
virtual id 0, which translate to the sink, so they write and read only the
pool's sink (DESIGN.md: page 0 holds no data). The rows are `max_pages`
wide so that one capture serves every length.

Without `capture` (the CPU) the same static buffers run eagerly: the
padding and bucketing are the same, only the capture is skipped; the CPU
tests hold that path's tokens equal to the eager executor's.

With a `StateBinder` (a model with recurrent state: Nemotron-H's Mamba-2
mixers, LFM2's short conv), each bucket also keeps a static slot index
`[n]`, which a step fills with its requests' state slots, and a
transformers cache. Where every recurrent layer is a Mamba-2 mixer, the
mixers update the state in the pool's slots (`sim.real.slot_decode`, as
vLLM's and SGLang's Mamba-2 mixers pass their state indices to the conv
and the SSM update kernels): the cache carries the index as `DecodeSlots`,
its recurrent tensors keep one row nobody reads (one store for every
bucket), and nothing is gathered or scattered. Otherwise (LFM2's short
conv) the cache holds `n` rows of recurrent state at fixed addresses
(`StateBinder.static_cache`): views of one store of the largest bucket's
rows (`capture_buckets` sizes it first), since one step runs at a time
(Nemotron-3-Nano would keep 47 MiB of state a row). That bucket's forward
gathers the batch's state from the pool's state slots by the index into
the cache (`StateBinder.gather`), runs the model with it (the one-token
paths update it in place) and scatters it back by the same index
(`StateBinder.scatter`). Either way the index is all a step changes: it
is read inside the captured region, so a page move between steps changes
only the index a step copies in. Padding rows read and write `PAD_SLOT`,
a slot in the pool's sink that no request holds (several padding rows
writing it is harmless). `stats()["state"]` says which path a model took.
The cache's attention layers stay empty (`hold_empty`): the pool holds
their K/V. The step is set with `use_step`, not the forward's keyword,
since transformers hands that keyword to the Mamba-2 mixer's kernels as
well. Such a bucket is not compiled (the compiled layers take a cache
only for prefill chunks, `sim.real.hybrid`: `stats()` records why). A forward that reads the device on the host
cannot be captured; `capture_hazard` names the ones this model family has
(transformers' eager MoE experts loop; its grouped_mm experts on CUDA with
weights other than bf16, or off compute capability 9.x / 10.x, where
torch's grouped_mm copies its offsets to the host) and the constructor refuses such a
model with recurrent state (the executor then decodes it eagerly and says
why); an attention-only model's failed capture stays recorded per bucket.

With `compile`, each decoder layer runs through `torch.compile` (inductor's
default mode, no CUDA graphs of its own, `fullgraph=True`; `CompiledLayers`),
so inductor fuses the layer's elementwise work (norms, rotary, activations,
residual adds, casts) between its matmuls; the embedding, the rotary
tables, the final norm, the head and the pick stay eager. The attention
writes and attends through one opaque operator (`StepContext(opaque=True)`,
`unikv.kernels.attention.op`), given the step as a keyword (dynamo does not
trace `ContextVar.get`) and its layer's caches as attributes of its module,
so nothing layer-specific is a constant of the graph: every layer of a kind
(Gemma-3: window, full) shares one compiled graph, and the compile time is
that of one or two layers, not of the model (a whole-model compile of
Gemma-3-12B took minutes). The bucket's first forward compiles, then the
capture records the compiled kernels. Bucket 1 is compiled for its static
shapes; the batch dimension of the larger buckets and the page count of
the pool's caches are marked dynamic, so every bucket of 2 and more, and
every pool the same model runs on, share the same graphs. A compile or a
capture of the compiled forward that fails is recorded (`stats()`) and the
bucket runs the uncompiled forward instead: a failure never ends the run.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# dynamo compiles one artefact per bucket shape it has not seen (and per
# model, pool shape): more than its default 8 per function in a long run;
# past the limit it would run the function uncompiled without an error
RECOMPILE_LIMIT = 64


def capture_hazard(model) -> str | None:
    """Why `model`'s decode forward cannot be captured as a CUDA graph
    (None: nothing known). transformers' one-token Mamba-2 and short-conv
    paths branch on host values only (shapes, `has_previous_state`,
    `record_past`); its eager MoE experts loop reads the device: an experts
    module (a class under `use_experts_implementation`) whose
    `config._experts_implementation` is "eager" runs the class's own
    forward, which syncs (`.nonzero()`, `.item()`; Nemotron-H:
    `NemotronHExperts.forward`). The answer names the first such line of
    the installed transformers. Its grouped_mm experts sync on CUDA unless
    their weights are bf16 on compute capability 9.x / 10.x
    (`_grouped_mm_hazard`)."""
    import inspect

    for module in model.modules() if model is not None else ():
        config = getattr(module, "config", None)
        if not hasattr(module, "is_concatenated") or not hasattr(module, "has_gate") or config is None:
            continue
        if getattr(config, "_experts_implementation", None) == "grouped_mm":
            why = _grouped_mm_hazard(module)
            if why is not None:
                return why
            continue
        if getattr(config, "_experts_implementation", None) not in (None, "eager"):
            continue
        forward = inspect.unwrap(type(module).forward)
        lines, first = inspect.getsourcelines(forward)
        at = next(((first + i, ln.strip()) for i, ln in enumerate(lines)
                   if any(sync in ln for sync in (".item()", ".nonzero()", ".tolist()"))), None)
        if at is None:
            continue
        path = inspect.getsourcefile(forward) or "?"
        path = path[path.rfind("transformers/"):] if "transformers/" in path else path
        return (f"{type(module).__name__}.forward ({path}:{at[0]}: `{at[1]}`) reads the device "
                f"(experts_implementation='eager'), which a CUDA graph cannot capture; expected "
                f"experts_implementation='grouped_mm' (transformers' default where it dispatches)")
    return None


def _grouped_mm_hazard(experts) -> str | None:
    """Why transformers' grouped_mm experts (`integrations/moe.py`,
    `_grouped_mm` -> `torch.nn.functional.grouped_mm`) read the device on
    CUDA for `experts`' weights (None: they do not). torch's CUDA
    `_grouped_mm` runs its CUTLASS kernel only for bfloat16 operands on
    compute capability 9.x or 10.x; otherwise it falls back to a loop over
    `offs.cpu()` (aten/src/ATen/native/cuda/GroupedBlas.cpp,
    `_grouped_mm_fallback` in GroupedMMUtils.h), a copy to the host that a
    capture cannot hold ("Cannot copy between CPU and CUDA tensors during
    CUDA graph capture", seen on the H200 with fp32 weights)."""
    import torch

    weight = next((p for p in experts.parameters() if p.dim() == 3), None)
    if weight is None or weight.device.type != "cuda":
        return None
    major = torch.cuda.get_device_capability(weight.device)[0]
    if weight.dtype == torch.bfloat16 and major in (9, 10):
        return None
    return (f"{type(experts).__name__}: torch's grouped_mm runs its CUDA kernel only for bfloat16 weights on "
            f"compute capability 9.x or 10.x (here {weight.dtype}, {major}.x) and otherwise loops over "
            f"offs.cpu(), which a CUDA graph cannot capture; expected bf16 weights on an H100/H200/B200")


def decode_picks(model, ids, pos, ctx) -> Any:
    """Greedy next token `[n]` of each row of a padded decode step: the
    model's forward over `ids` / `pos` `[n, 1]`, its attention reading the
    step `ctx` (a `StepContext`, passed as the forward's keyword)."""
    logits = model(input_ids=ids, position_ids=pos, use_cache=False, unikv_step=ctx).logits
    return logits[:, -1].argmax(-1)


class CompiledLayers:
    """A model's decoder layers through `torch.compile`, swapped in for the
    duration of `active(...)`: one compiled forward per layer class.

    Layers of a class share its compiled graphs because nothing
    layer-specific is a constant in them: the parameters are graph inputs
    (dynamo inlines the modules), and so are the layer's cache views, set
    for the block as the attention module's `unikv_cache` (K view, V view,
    band), which the attention function reads instead of the layer index.
    Layers whose attributes differ (Gemma-3's window and full layers) make
    one graph each.

    A hybrid's layers (`sim.real.hybrid`: Nemotron-H's blocks, whose
    `mixer` is an attention, a Mamba-2 mixer, an MoE or an MLP; LFM2's
    attention and short-conv layers) compile the same way, one graph per
    block kind: a recurrent layer's forward gets, in place of the
    forward's transformers cache, that cache's one layer behind the cache
    API (`hybrid.LayerCache`), so its layer index is no constant of the
    graph; an attention or MLP / MoE block gets no cache (the pool holds
    the K / V). A first chunk (no state) and a continuing one are two
    graphs (the guards read the cache layer's flags).

    Args:
        model: a transformers causal LM (`get_decoder().layers`, each layer's
            attention module `self_attn` with its `layer_idx`, or a hybrid's
            blocks: `sim.real.hybrid`).
        backend, mode: `torch.compile`'s.
    Raises:
        ValueError: a model without such layers.
    """

    def __init__(self, model, *, backend: Any, mode: str | None) -> None:
        import torch
        from unikv.sim.real.hybrid import attention_module, recurrent_module, stateless_block

        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = tuple(getattr(decoder, "layers", None) or ())
        attention = tuple(attention_module(x) for x in layers)
        recurrent = tuple(recurrent_module(x) if a is None else None for x, a in zip(layers, attention))
        if not layers or not any(a is not None for a in attention) or not all(
                a is not None or r is not None or stateless_block(x) for x, a, r in zip(layers, attention, recurrent)):
            raise ValueError(f"CompiledLayers: {type(model).__name__} has no decoder layers with a self_attn "
                             "module (get_decoder().layers[i].self_attn.layer_idx), nor a hybrid's blocks (an "
                             "attention, recurrent or MLP / MoE mixer each: sim.real.hybrid)")
        self.layers = layers
        self.attention = attention  # each layer's attention module (None: a recurrent or MLP / MoE block)
        self.recurrent = recurrent  # each layer's recurrent module (None: none)
        self.compiled = {cls: torch.compile(cls.forward, backend=backend, mode=mode, fullgraph=True)
                         for cls in {type(x) for x in layers}}

    @property
    def hybrid(self) -> bool:
        """Whether some layer has no attention module (a hybrid's stack)."""
        return any(a is None for a in self.attention)

    @contextlib.contextmanager
    def active(self, views, batch: int, dim: int = 0) -> Iterator[None]:
        """Run the layers compiled over `views`' caches for the block;
        `batch` > 1: the inputs' dimension `dim` is marked dynamic where
        it has size `batch` (decode: 0, the requests of `[B, 1, ...]`;
        a packed step: 1, the tokens of `[1, T, ...]`)."""
        recurrent = [rec for rec in self.recurrent if rec is not None]
        own = [rec.layer_idx for rec in recurrent]
        try:
            for layer, attn, rec in zip(self.layers, self.attention, self.recurrent):
                if attn is not None:
                    i = attn.layer_idx
                    attn.unikv_cache = (views.k(i), views.v(i), views.band(i))
                index = rec.layer_idx if rec is not None else None
                layer.forward = types.MethodType(self._forward(type(layer), batch, dim, rec, attn, index), layer)
            # One index for every recurrent module inside the block: an integer attribute of a module is a
            # constant of dynamo's graphs, and transformers 5.17's Mamba-2 mixer indexes the cache with it
            # (`cache_params.layers[self.layer_idx]`), which made one graph per layer on the H200 (past the
            # recompile limit). Its `LayerCache` answers every index with the layer's own state.
            for rec in recurrent:
                rec.layer_idx = own[0]
            yield
        finally:  # the model as it was: no reference to this pool's views is kept
            for rec, index in zip(recurrent, own):
                rec.layer_idx = index
            for layer, attn in zip(self.layers, self.attention):
                layer.__dict__.pop("forward", None)
                if attn is not None:
                    attn.__dict__.pop("unikv_cache", None)

    def _forward(self, cls: type, batch: int, dim: int, recurrent: Any = None, attention: Any = None,
                 index: int | None = None) -> Callable:
        import torch
        from unikv.sim.real.hybrid import layer_kwargs

        compiled = self.compiled[cls]

        def forward(layer, *args, **kwargs):
            kwargs = layer_kwargs(kwargs, recurrent, attention, index)
            if batch > 1:  # hidden states, positions, rotary tables: `batch` long in `dim`
                for t in _tensors(args, kwargs):
                    if t.dim() > dim and t.shape[dim] == batch:
                        torch._dynamo.maybe_mark_dynamic(t, dim)
            return compiled(layer, *args, **kwargs)

        return forward


def mark_caches_dynamic(views) -> None:
    """Mark the page count of every K / V cache of `views` dynamic: the
    pool's size is no part of a compiled graph."""
    import torch

    for layer, spec in views.layers.items():
        if spec.kind == "kv":
            torch._dynamo.maybe_mark_dynamic(views.k(layer), 0)
            torch._dynamo.maybe_mark_dynamic(views.v(layer), 0)


def _tensors(args: tuple, kwargs: dict) -> Iterator[Any]:
    """The tensors among `args` and `kwargs`' values, one tuple level deep."""
    import torch

    for x in (*args, *kwargs.values()):
        for t in x if isinstance(x, (tuple, list)) else (x,):
            if isinstance(t, torch.Tensor):
                yield t


@dataclass
class _Bucket:
    """One bucket's static buffers (and, once captured, its graph and output)."""

    ids: Any
    pos: Any
    cu_q: Any
    seq_lens: Any
    rows: Any  # [n, max_pages] int64 virtual pages
    vids: Any  # [n] int64 virtual token ids written
    slots: Any = None  # [n] int64 state slots (a binder's); padding: PAD_SLOT
    cache: Any = None  # the binder's static cache of n rows
    attention: tuple = ()  # its attention layers, held empty
    empty: Any = None  # the 0-element K/V they hold
    graph: Any = None
    out: Any = None
    compiled: bool = False  # its forward runs the compiled layers
    steps: int = field(default=0)
    filled: tuple[int, int] = (0, 0)  # rows and columns the last fill wrote (the rest is padding)


class DecodeGraphs:
    """Decode steps through static per-bucket buffers, captured on CUDA.

    Args:
        model: the causal LM (attention implementation "unikv").
        views: the pool's `KVViews`.
        bands: the token bands the layers store on.
        device: the model's device.
        max_pages: the block tables' width (the most pages one request holds).
        buckets: batch sizes a step is padded up to; a larger step runs eagerly.
        capture: capture CUDA graphs (default: on a CUDA device).
        compile: run the forward through `torch.compile` (see the module
            docstring); off by default.
        compile_backend, compile_mode: `torch.compile`'s `backend` and
            `mode` ("inductor" and its default mode; "aot_eager" traces and
            functionalises without generating code: a check on the CPU).
        binder: the `StateBinder` of a model with recurrent state (None:
            none); its buckets update the state in slot, or gather and
            scatter it (module doc).
    Raises:
        ValueError: one line: a compile mode that captures CUDA graphs
            itself ("reduce-overhead", "max-autotune": the buckets capture
            theirs), or, with `capture` and a `binder`, a model whose
            forward reads the device (`capture_hazard`; an attention-only
            model's failed capture is recorded per bucket instead).
    """

    def __init__(self, model, views, bands: Sequence[str], *, device: str, max_pages: int,
                 buckets: Sequence[int] = BUCKETS, capture: bool | None = None, compile: bool = False,
                 compile_backend: str = "inductor", compile_mode: str | None = None, binder=None) -> None:
        if compile_mode in ("reduce-overhead", "max-autotune"):
            raise ValueError(f"DecodeGraphs: compile_mode={compile_mode!r} captures CUDA graphs itself; expected "
                             "None, 'default' or 'max-autotune-no-cudagraphs' (the buckets capture the graphs)")
        capture = str(device).startswith("cuda") if capture is None else capture
        # attention-only models keep recording a failed capture per bucket (`failures`), as before
        hazard = capture_hazard(model) if capture and binder is not None else None
        if hazard is not None:
            raise ValueError(f"DecodeGraphs: {hazard}")
        self.model = model
        self.views = views
        self.bands = tuple(bands)
        self.device = device
        self.max_pages = int(max_pages)
        self.buckets = tuple(sorted(buckets))
        self.capture = capture
        self.compile = bool(compile)
        self.binder = binder
        self.cache_kwarg = ""
        self._scan: Any = contextlib.nullcontext
        self.gathers: str | None = None  # with a binder: why the buckets gather and scatter the state (None: in slot)
        if binder is not None:
            from unikv.sim.real.slot_decode import slot_ready
            from unikv.sim.real.ssd import scan_for
            from unikv.sim.real.state import cache_kwarg

            self.cache_kwarg = cache_kwarg(model)
            # a Mamba-2 mixer's decode update through unikv's kernel (`sim.real.ssd.state_update`), as eager decode
            self._scan = scan_for(model)
            self.gathers = slot_ready(model)
        self.in_slot = binder is not None and self.gathers is None
        self._buckets: dict[int, _Bucket] = {}
        self._store: tuple[int, Any] = (0, None)  # a binder's: (rows, the static cache every bucket's is a view of)
        self.failures: dict[int, str] = {}  # bucket -> why its capture failed
        self.compile_failures: dict[int, str] = {}  # bucket -> why its compile (or compiled capture) failed
        self.compile_s: dict[int, float] = {}  # bucket -> seconds of its first (compiling) forward
        self._layers: CompiledLayers | None = None
        self._refused: str | None = None  # why the model cannot be compiled at all
        if self.compile and binder is not None:
            self._refused = ("recurrent state: the decode buckets do not pass the state binder's static cache to "
                             "the compiled layers (only prefill chunks do), so the buckets run uncompiled")
        elif self.compile:
            self._prepare_compile(compile_backend, compile_mode)

    def _prepare_compile(self, backend: Any, mode: str | None) -> None:
        """The compiled layers, the operator registered (dynamo cannot trace
        the registration) and the caches' page count marked dynamic (the
        pool's size is no part of the graphs); a model that cannot be
        compiled is recorded, and every bucket then runs uncompiled."""
        from unikv.kernels.attention.op import attention_op

        attention_op()
        try:
            self._layers = CompiledLayers(self.model, backend=backend, mode=mode)
        except ValueError as exc:
            self._refused = f"ValueError: {exc}"
            return
        mark_caches_dynamic(self.views)

    def bucket(self, batch_size: int) -> int | None:
        """The smallest bucket holding `batch_size` requests (None: none does)."""
        return next((n for n in self.buckets if n >= batch_size), None)

    def capture_buckets(self, max_batch: int) -> None:
        """Build (and on CUDA capture) every bucket a step of up to
        `max_batch` requests can use, as a serving engine does at start-up,
        so that no capture lands inside a step's measured time."""
        top = self.bucket(max_batch) or self.buckets[-1]
        if self.binder is not None:  # one store of the largest bucket's rows: the smaller ones are views of it
            self._state_store(self._state_rows(top))
        for n in self.buckets:
            if n <= top and n not in self._buckets:
                self._build(n)

    def run(self, batch, state_slots=None) -> Any:
        """Greedy next tokens `[B]` of a padded (decode-only) `StepBatch`, or
        None when no bucket fits it or it carries no virtual rows (a
        `readable` batch): the caller runs it eagerly.

        Args:
            batch: the step's `StepBatch`.
            state_slots: with a binder, the requests' physical state slots
                `[B]` in batch order (`pool.translate(state ids, band)`).
        Raises:
            ValueError: with a binder, no `state_slots`, or host slots that
                repeat a slot or hold `PAD_SLOT`.
        """
        b = len(batch.requests)
        n = self.bucket(b)
        if batch.layout != "padded" or n is None or batch.page_rows is None:
            return None
        width = int(batch.page_rows.shape[1])
        if width > self.max_pages:
            return None
        slots = self._slots(state_slots, b)
        st = self._buckets.get(n) or self._build(n)
        self._fill(st, batch, b, width, slots)
        st.steps += 1
        if st.graph is None:
            return self._forward(st)[:b]
        st.graph.replay()
        return st.out[:b]

    def _slots(self, state_slots, b: int) -> Any:
        """The step's state slots as the binder's device index (None without a binder)."""
        if self.binder is None:
            return None
        from unikv.sim.real.state import request_slots

        return request_slots(self.binder, state_slots, b, "DecodeGraphs.run")

    def _static(self, n: int) -> _Bucket:
        import torch

        dev = self.device
        st = _Bucket(
            ids=torch.zeros((n, 1), dtype=torch.int64, device=dev),
            pos=torch.zeros((n, 1), dtype=torch.int64, device=dev),
            cu_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(n, dtype=torch.int32, device=dev),
            rows=torch.zeros((n, self.max_pages), dtype=torch.int64, device=dev),
            vids=torch.zeros(n, dtype=torch.int64, device=dev))
        if self.binder is not None:  # every row pads until a fill: the sink's slot
            from unikv.sim.real.state import PAD_SLOT

            st.slots = torch.full((n,), PAD_SLOT, dtype=torch.int64, device=dev)
            rows = self._state_rows(n)
            st.cache = self.binder.static_cache(rows, share=self._state_store(rows))
            if self.in_slot:  # the mixers read and write the pool's slots by `st.slots`
                from unikv.sim.real.slot_decode import DecodeSlots, carry

                carry(st.cache, DecodeSlots(st.slots, self.binder.views))
            st.attention = tuple(self.binder.attention_layers(st.cache))
            st.empty = torch.empty(0, dtype=self.model.dtype, device=dev)
        return st

    def _state_rows(self, n: int) -> int:
        """Rows of state a bucket of `n` keeps in its static cache: `n`
        where it gathers the batch's state, 1 where its mixers update the
        slots in place (transformers' model code needs the cache's layers,
        but no mixer reads them: `sim.real.slot_decode`)."""
        return 1 if self.in_slot else n

    def _state_store(self, n: int) -> Any:
        """The static cache the buckets' caches are views of, grown to `n`
        rows when smaller (a bucket built before keeps the store it views).
        One step runs at a time, and each forward gathers its rows before
        it reads them, so buckets may share the rows."""
        if self._store[0] < n:
            self._store = (n, self.binder.static_cache(n))
        return self._store[1]

    def _fill(self, st: _Bucket, batch, b: int, width: int, slots=None) -> None:
        """Copy the step into the bucket's buffers; the rows past `b` pad.

        Only what the last fill left live outside this step's `[b, width]`
        is reset to padding (`st.filled`): a steady batch costs five copies
        and no fills (each a launch of host time on a GPU)."""
        live_b, live_w = st.filled
        st.ids[:b].copy_(batch.input_ids, non_blocking=True)
        st.pos[:b].copy_(batch.position_ids, non_blocking=True)
        st.seq_lens[:b].copy_(batch.seq_lens, non_blocking=True)
        st.rows[:b, :width].copy_(batch.page_rows, non_blocking=True)
        st.vids[:b].copy_(batch.write_vids, non_blocking=True)
        if st.slots is not None:
            st.slots[:b].copy_(slots, non_blocking=True)
        if live_b > b:  # rows the last step used and this one pads
            st.ids[b:live_b].zero_()
            st.pos[b:live_b].zero_()
            st.seq_lens[b:live_b].fill_(1)
            st.rows[b:live_b].zero_()
            st.vids[b:live_b].zero_()
            if st.slots is not None:
                from unikv.sim.real.state import PAD_SLOT

                st.slots[b:live_b].fill_(PAD_SLOT)
        if live_w > width:  # columns past this step's widest request
            st.rows[:min(b, live_b), width:live_w].zero_()
        st.filled = (b, width)

    def _forward(self, st: _Bucket, compiled: bool | None = None) -> Any:
        """The bucket's forward over its buffers: the compiled layers when
        `compiled` (default: the bucket's own choice, `st.compiled`)."""
        from unikv.sim.real.attention import StepContext

        compiled = st.compiled if compiled is None else compiled
        # inside the capture: the pool's device tables are read at replay time (committed by the batch build)
        tables = {band: self.views.translate_pages(st.rows, band) for band in self.bands}
        slots = {band: self.views.translate_slots(st.vids, band) for band in self.bands}
        ctx = StepContext(views=self.views, block_tables=tables, cu_q=st.cu_q, seq_lens=st.seq_lens,
                          write_slots=slots, layout="padded", opaque=compiled)
        if self.binder is not None:
            return self._state_forward(st, ctx)
        if not compiled or self._layers is None:
            return decode_picks(self.model, st.ids, st.pos, ctx)
        import torch

        n = st.ids.shape[0]
        if n > 1:  # the translated tables and slots: as the bucket's buffers (`_compile`)
            for t in (*tables.values(), *slots.values()):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        # inference mode always: the graphs were compiled under it (another grad mode would recompile)
        with torch.inference_mode(), self._layers.active(self.views, n), torch._dynamo.config.patch(
                recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            return decode_picks(self.model, st.ids, st.pos, ctx)

    def _state_forward(self, st: _Bucket, ctx) -> Any:
        """The forward of a model with recurrent state over the bucket's
        buffers: gather the rows' state by `st.slots` into the static
        cache, run the model with it (a Mamba-2 mixer's decode update
        through unikv's kernel: `sim.real.ssd.kernel_chunk_scan`), scatter
        the state back (all on the device, no host read: the capture
        records the three)."""
        from unikv.sim.real.attention import use_step
        from unikv.sim.real.mixers import served_mixers
        from unikv.sim.real.state import hold_empty

        for layer in st.attention:
            hold_empty(layer, st.empty)
        if self.in_slot:  # the cache carries `DecodeSlots`: each mixer updates the slots in place
            with use_step(ctx), served_mixers(self.model):
                logits = self.model(input_ids=st.ids, position_ids=st.pos, use_cache=True,
                                    **{self.cache_kwarg: st.cache}).logits
            return logits[:, -1].argmax(-1)
        self.binder.gather(st.cache, st.slots)
        with use_step(ctx), self._scan():
            logits = self.model(input_ids=st.ids, position_ids=st.pos, use_cache=True,
                                **{self.cache_kwarg: st.cache}).logits
        self.binder.scatter(st.cache, st.slots)
        return logits[:, -1].argmax(-1)

    def _compile(self, st: _Bucket, n: int) -> None:
        """The bucket's step: compiled when the first forward through
        `torch.compile` succeeds (timed: `compile_s`), else the uncompiled
        one, the error recorded (`compile_failures`)."""
        if not self.compile:
            return
        if self._layers is None:
            self.compile_failures[n] = self._refused or "no compiled layers"
            return
        import torch

        if n > 1:  # one artefact for every bucket of 2 and more (size 1 is always specialised)
            for t in (st.ids, st.pos, st.cu_q, st.seq_lens, st.rows, st.vids):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        cuda = str(self.device).startswith("cuda")
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                self._forward(st, compiled=True)
            if cuda:
                torch.cuda.synchronize(self.device)
        except Exception as exc:  # any compiler error: this bucket runs uncompiled, the stats say why
            self.compile_failures[n] = compile_error(exc)
            return
        self.compile_s[n] = time.perf_counter() - t0
        st.compiled = True

    def _build(self, n: int) -> _Bucket:
        """The bucket's buffers and, with `capture`, its graph: two warm-up
        forwards on a side stream, then the capture (the padding rows write
        only the sink, so warm-up and capture touch no live KV and, with a
        binder, no live state slot). With
        `compile`, the compiling forward comes first; a compiled forward
        that fails to compile, warm up or capture is recorded and the
        bucket falls back to the uncompiled one."""
        st = self._static(n)
        self._buckets[n] = st
        if not self.capture:
            self._compile(st, n)
            return st
        if self.compile:
            with side_stream(self.device):
                self._compile(st, n)
            if st.compiled and self._capture_compiled(st, n):
                return st
        self._warm_up(st)
        try:
            self._capture(st)
        except RuntimeError as exc:
            # a forward that syncs or changes shape with the data (transformers'
            # eager MoE loops over the experts hit) cannot be captured: this
            # bucket runs its static buffers eagerly, and the stats say why
            self.failures[n] = _first_line(exc)
        return st

    def _capture_compiled(self, st: _Bucket, n: int) -> bool:
        """Warm up and capture the compiled forward; False (the error
        recorded, the bucket's step the uncompiled one) when either fails."""
        try:
            self._warm_up(st)
            self._capture(st)
        except Exception as exc:  # any error of the compiled code: the uncompiled forward instead
            self.compile_failures[n] = f"capture: {compile_error(exc)}"
            st.compiled = False
            return False
        return True

    def _warm_up(self, st: _Bucket) -> None:
        """Two forwards of the bucket's step on a side stream, before its capture."""
        warm_up(self.device, lambda: self._forward(st))

    def _capture(self, st: _Bucket) -> None:
        """Capture the bucket's forward (its step) as its graph."""
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            out = self._forward(st)
        st.graph, st.out = graph, out

    def stats(self) -> dict:
        """Buckets built, steps run through them, buckets captured as graphs,
        and why a capture failed (bucket -> the error's first line); with
        `compile`: the buckets that run compiled, the seconds of each
        bucket's compiling forward, and why a compile failed; with a
        binder: where the decode updates the state (`state`: "in slot", or
        why it is gathered and scattered)."""
        out = {"buckets": sorted(self._buckets), "steps": sum(b.steps for b in self._buckets.values()),
               "captured": sorted(n for n, b in self._buckets.items() if b.graph is not None),
               "failures": dict(self.failures)}
        if self.binder is not None:
            out["state"] = "in slot" if self.in_slot else f"gathered and scattered: {self.gathers}"
        if self.compile:
            out.update(compiled=sorted(n for n, b in self._buckets.items() if b.compiled),
                       compile_s=dict(self.compile_s), compile_failures=dict(self.compile_failures))
        return out


@contextlib.contextmanager
def side_stream(device) -> Iterator[None]:
    """Run the block on a side stream of `device` that waits for, and is
    waited on by, its current one (PyTorch's recipe for work before a
    capture, `torch.cuda.graphs`)."""
    import torch

    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        yield
    main.wait_stream(side)


def warm_up(device, forward: Callable[[], Any]) -> None:
    """Two calls of `forward` on a side stream of `device`, in inference
    mode: what a graph's capture asks before it."""
    import torch

    with side_stream(device), torch.inference_mode():
        for _ in range(2):
            forward()


def compile_error(exc: BaseException) -> str:
    """The error's type and first two lines (dynamo's first line of a
    backend's failure only names the backend: "backend='inductor' raised:")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {' '.join(lines[:2])[:300]}"


def _first_line(exc: BaseException) -> str:
    """The error's first line (a compiler error spans pages), or its type."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
