"""Prefill and mixed steps as CUDA graphs per token-count bucket (issue 17).

A step with a prefill chunk is one packed `[1, T]` forward; compiled
(`sim.real.prefill.CompiledPrefill`) or not, its host work per layer
(dynamo's guards, inductor's wrapper, the attention operator's Python)
binds chunks of up to about a thousand tokens on a GPU. `PackedGraphs` is
the packed counterpart of `sim.real.graphs.DecodeGraphs`: per bucket of
token counts it keeps static buffers of the bucket's size, captures the
forward once over them, and per step copies the step into them and
replays the graph, so a step costs one launch of host work.

A bucket of N tokens holds R = min(max_requests, N) request slots (a
step's requests each bring one token or more, so a step of T <= N tokens
has at most T) and one padding request after them:

- `ids`, `pos` `[1, N]`: the step's tokens, then token 0 at position 0;
- `vids` `[N]`: the virtual ids written, then 0 (the sink's slot);
- `cu_q` `[R + 2]`, `seq_lens` `[R + 1]`: the step's B requests, then the
  padding request, whose N - T queries attend over N - T keys of its table
  row (all 0: only the sink page), then empty requests (no query, no key:
  the attention kernel and its reference skip them);
- `rows` `[R + 1, W]`: the requests' virtual pages (0 past them); W is
  `max_pages`, or the N / page_size pages of the padding request's keys
  where that is more (a pool of fewer tokens than the bucket);
- `keep` `[R]`: the token rows whose logits are kept (the step's sampled
  rows, then row 0; its pick is dropped).

The graph translates the rows and ids to physical pages and slots from the
pool's device tables (`KVViews.translate_pages` / `translate_slots`, read
at replay), runs the forward and takes the greedy pick of each kept row.
Padding reads and writes only the sink (DESIGN.md: page 0 holds no data),
and changes no real row: the attention is per request, the norms and
matmuls per token. The kernel's launch plan (`unikv.kernels.attention.
kernel.plan`) comes from shapes only, which a bucket fixes.

A step of more tokens than the largest bucket, of more requests than
`max_requests`, or with a table wider than `max_pages` runs as before
(`run` returns None) and is counted (`fallbacks`). With a `CompiledPrefill`
the bucket's forward runs its compiled layers (the graphs it compiled for
every token count serve every bucket); a compiled forward that fails to
compile, warm up or capture is recorded and the bucket captures the eager
forward; a capture that fails is recorded and the bucket runs its static
buffers uncaptured. Without `capture` (the CPU) the buffers run eagerly:
the padding and bucketing are the same, so the CPU tests check them.

On CUDA the buckets share one graph memory pool (`warm_up` captures the
largest first, as serving engines do): only one packed graph runs at a
time, and each pick is copied out of the graph's output before the next.

A model with recurrent state (Nemotron-H's Mamba-2 mixers; a `binder`)
runs each prefill chunk alone (`sim.real.executor.state_plans`), so its
packed steps are one request each. Its bucket's forward gathers the
request's state from its slot (an index buffer, `PAD_SLOT` until a
fill) into one static one-row cache the buckets share, runs the model
with the mixers' padded chunk path (`sim.real.padded_chunk`: the conv
state and the scan stop at the chunk's real length, a device buffer, and
a first chunk starts from zero state by a device flag), and scatters the
state back: the gather, the forward and the scatter are one captured
graph, as the decode buckets' are (`sim.real.graphs.DecodeGraphs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unikv.sim.real.graphs import compile_error, warm_up

PACKED_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
"""Token counts a packed step is padded up to (powers of two and the
midpoints between them: a step of more than 32 tokens computes at most a
third more tokens than its own); a larger step runs uncaptured."""


@dataclass
class _Packed:
    """One bucket's static buffers (and, once captured, its graph and output)."""

    tokens: int  # N
    requests: int  # R, the request slots before the padding request
    ids: Any
    pos: Any
    vids: Any
    cu_q: Any
    seq_lens: Any
    rows: Any
    keep: Any
    graph: Any = None
    out: Any = None
    compiled: bool = False  # its forward runs the compiled layers
    steps: int = 0
    filled: tuple[int, int] = (0, 0)  # rows and columns of `rows` the last fill wrote


class PackedGraphs:
    """Packed steps through static per-token-bucket buffers, captured on CUDA.

    Args:
        model: the causal LM (attention implementation "unikv").
        views: the pool's `KVViews`.
        bands: the token bands the layers store on.
        device: the model's device.
        max_pages: the block tables' width (the most pages one request holds).
        max_requests: the most requests a captured step holds (the
            scheduler's running cap); a step of more runs uncaptured.
        buckets: token counts a step is padded up to.
        capture: capture CUDA graphs (default: on a CUDA device).
        prefill: a `CompiledPrefill` over the same views whose compiled
            layers the buckets run (None: the eager layers).
        binder: the `StateBinder` of a model with recurrent state, every
            recurrent layer a Mamba-2 mixer (module docstring; None: none).
    Raises:
        ValueError: `max_pages` or `max_requests` below 1, buckets that
            are not positive ints, or a binder's model with recurrent
            layers the padded chunk path does not run (named).
    """

    def __init__(self, model, views, bands: Sequence[str], *, device: str, max_pages: int, max_requests: int,
                 buckets: Sequence[int] = PACKED_BUCKETS, capture: bool | None = None, prefill=None,
                 binder=None) -> None:
        for name, value in (("max_pages", max_pages), ("max_requests", max_requests)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PackedGraphs: {name}={value!r}; expected an int >= 1")
        sizes = tuple(buckets)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"PackedGraphs: buckets={list(sizes)!r}; expected one or more ints >= 1")
        self.model = model
        self.views = views
        self.bands = tuple(bands)
        self.device = device
        self.max_pages = max_pages
        self.max_requests = max_requests
        self.buckets = tuple(sorted(set(sizes)))
        self.capture = str(device).startswith("cuda") if capture is None else bool(capture)
        self.prefill = prefill
        self.fallbacks = 0  # packed steps no bucket took
        self.failures: dict[int, str] = {}  # bucket -> why its capture failed
        self.compile_failures: dict[int, str] = {}  # bucket -> why its compiled forward was given up
        self._buckets: dict[int, _Packed] = {}
        self._pool: Any = None  # the buckets' shared graph memory pool (CUDA)
        self.binder = binder
        if binder is not None:
            self._bind_state(model)

    def _bind_state(self, model) -> None:
        """A binder's buffers: the chunk's slot, length and first-chunk flag,
        and the static one-row cache every bucket gathers into."""
        import torch
        from unikv.sim.real.padded_chunk import ChunkLength, padded_ready
        from unikv.sim.real.state import PAD_SLOT, cache_kwarg

        why = padded_ready(model)
        if why is not None:
            raise ValueError(f"PackedGraphs: {why}")
        dev = self.device
        self.slot = torch.full((1,), PAD_SLOT, dtype=torch.int64, device=dev)
        self.chunk = ChunkLength(length=torch.zeros(1, dtype=torch.int64, device=dev),
                                 fresh=torch.ones(1, dtype=torch.bool, device=dev))
        self.cache = self.binder.static_cache(1)
        self.attention = tuple(self.binder.attention_layers(self.cache))
        self.empty = torch.empty(0, dtype=model.dtype, device=dev)
        self.cache_kwarg = cache_kwarg(model)

    def bucket(self, tokens: int) -> int | None:
        """The smallest bucket holding `tokens` tokens (None: none does)."""
        return next((n for n in self.buckets if n >= tokens), None)

    def warm_up(self) -> None:
        """Build (and on CUDA capture) every bucket, the largest first, as a
        serving engine does at start-up: no capture lands inside a step's
        measured time. Warm-up and capture write only the pool's sink."""
        for n in reversed(self.buckets):
            if n not in self._buckets:
                self._build(n)

    def run(self, batch, state_slots=None, fresh: bool = False) -> Any:
        """Greedy next tokens `[S]` of a packed `StepBatch`'s sampled rows, or
        None when no bucket takes it (too many tokens or requests, a table
        wider than `max_pages`) or it carries no virtual rows (a `readable`
        batch): the caller runs it as before.

        Args:
            batch: the step's `StepBatch`.
            state_slots: with a binder, the request's physical state slot
                (one: a recurrent model's chunk runs alone).
            fresh: with a binder, the chunk starts the request (position 0).
        Raises:
            ValueError: with a binder, a batch of more than one request, or
                not one state slot, or the padding slot.
        """
        if batch.layout != "packed" or batch.page_rows is None:
            return None
        tokens, b = batch.num_tokens, len(batch.requests)
        width = int(batch.page_rows.shape[1])
        n = self.bucket(tokens)
        if n is None or b > self.max_requests or width > self.max_pages:
            self.fallbacks += 1
            return None
        slot = self._state_slot(state_slots, b) if self.binder is not None else None
        st = self._buckets.get(n) or self._build(n)
        self._fill(st, batch, tokens, b, width)
        if slot is not None:
            self._set_chunk(slot, tokens, fresh)
        st.steps += 1
        samples = int(batch.sample_rows.numel())
        if st.graph is None:
            return self._forward(st)[:samples]
        st.graph.replay()
        return st.out[:samples].clone()  # the pool is shared: the next bucket's replay may reuse this memory

    def _state_slot(self, state_slots, b: int) -> Any:
        """The chunk's state slot as the binder's device index `[1]`
        (`sim.real.state.request_slots`, as the decode buckets check theirs)."""
        from unikv.sim.real.state import request_slots

        if b != 1:
            raise ValueError(f"PackedGraphs.run: a model with recurrent state: {b} requests; expected one prefill "
                             "chunk (sim.real.executor.state_plans)")
        return request_slots(self.binder, state_slots, b, "PackedGraphs.run")

    def _set_chunk(self, slot, tokens: int, fresh: bool) -> None:
        """The binder's device buffers for the next forward: the state slot
        (an index `[1]`, or the padding slot as an int), the chunk's real
        tokens and whether it starts its request."""
        if isinstance(slot, int):
            self.slot.fill_(slot)
        else:
            self.slot.copy_(slot, non_blocking=True)
        self.chunk.length.fill_(tokens)
        self.chunk.fresh.fill_(bool(fresh))

    def _static(self, n: int) -> _Packed:
        import torch

        dev, r = self.device, min(self.max_requests, n)
        # wide enough for the padding request's keys, in a pool smaller than the bucket too
        width = max(self.max_pages, -(-n // self.views.page_size))

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=dev)

        cu_q = torch.full((r + 2,), n, dtype=torch.int32, device=dev)
        cu_q[0] = 0  # no step yet: the padding request holds every token
        seq_lens = zeros(r + 1, dtype=torch.int32)
        seq_lens[0] = n
        return _Packed(tokens=n, requests=r, ids=zeros(1, n), pos=zeros(1, n), vids=zeros(n), cu_q=cu_q,
                       seq_lens=seq_lens, rows=zeros(r + 1, width), keep=zeros(r))

    def _fill(self, st: _Packed, batch, tokens: int, b: int, width: int) -> None:
        """Copy the step into the bucket's buffers; everything past it pads.

        Only the rows and columns of `rows` the last fill left live outside
        this step's `[b, width]` are reset (`st.filled`): the table is the
        one large buffer."""
        n, s = st.tokens, int(batch.sample_rows.numel())
        st.ids[0, :tokens].copy_(batch.input_ids.reshape(-1), non_blocking=True)
        st.pos[0, :tokens].copy_(batch.position_ids.reshape(-1), non_blocking=True)
        st.vids[:tokens].copy_(batch.write_vids, non_blocking=True)
        st.cu_q[:b + 1].copy_(batch.cu_q, non_blocking=True)
        st.seq_lens[:b].copy_(batch.seq_lens, non_blocking=True)
        st.keep[:s].copy_(batch.sample_rows, non_blocking=True)
        if tokens < n:
            st.ids[0, tokens:].zero_()
            st.pos[0, tokens:].zero_()
            st.vids[tokens:].zero_()
        st.cu_q[b + 1:].fill_(n)  # the padding request's N - T queries, then empty requests
        st.seq_lens[b].fill_(n - tokens)
        st.seq_lens[b + 1:].zero_()
        st.keep[s:].zero_()
        live_b, live_w = st.filled
        st.rows[:b, :width].copy_(batch.page_rows, non_blocking=True)
        if live_b > b:  # rows the last step used: this one's padding request and empty requests
            st.rows[b:live_b].zero_()
        if live_w > width:
            st.rows[:min(b, live_b), width:live_w].zero_()
        st.filled = (b, width)

    def _forward(self, st: _Packed, compiled: bool | None = None) -> Any:
        """The greedy picks `[R]` of the bucket's kept rows: its forward over
        its buffers, through the compiled layers when `compiled` (default:
        the bucket's own choice, `st.compiled`)."""
        import torch
        from unikv.sim.real.attention import StepContext, use_step

        compiled = st.compiled if compiled is None else compiled
        # inside the capture: the pool's device tables are read at replay time (committed by the batch build)
        tables = {band: self.views.translate_pages(st.rows, band) for band in self.bands}
        slots = {band: self.views.translate_slots(st.vids, band) for band in self.bands}
        ctx = StepContext(views=self.views, block_tables=tables, cu_q=st.cu_q, seq_lens=st.seq_lens,
                          write_slots=slots, layout="packed")
        if self.binder is not None:
            return self._state_forward(st, ctx, compiled)
        if compiled and self.prefill is not None:
            out = self.prefill.forward(ctx, st.ids, st.pos, st.keep)
        else:
            with torch.inference_mode(), use_step(ctx):
                out = self.model(input_ids=st.ids, position_ids=st.pos, use_cache=False, logits_to_keep=st.keep)
        return out.logits[0].argmax(-1)

    def _state_forward(self, st: _Packed, ctx, compiled: bool) -> Any:
        """A recurrent model's chunk over the bucket's buffers: the slot's
        state gathered into the static cache, which carries the chunk's
        length (`sim.real.padded_chunk`), the forward with the mixers'
        padded path, the state scattered back (module docstring)."""
        import torch
        from unikv.sim.real.attention import use_step
        from unikv.sim.real.mixers import served_mixers
        from unikv.sim.real.padded_chunk import carry
        from unikv.sim.real.state import hold_empty

        def bind():
            for layer in self.attention:
                hold_empty(layer, self.empty)
            self.binder.gather(self.cache, self.slot)
            return carry(self.cache, self.chunk)

        with served_mixers(self.model):
            if compiled and self.prefill is not None:
                out, cache = self.prefill.forward_state(ctx, st.ids, st.pos, st.keep, bind=bind)
            else:
                cache = bind()
                with torch.inference_mode(), use_step(ctx):
                    out = self.model(input_ids=st.ids, position_ids=st.pos, use_cache=True, logits_to_keep=st.keep,
                                     **{self.cache_kwarg: cache})
        self.binder.scatter(cache, self.slot)
        return out.logits[0].argmax(-1)

    def _compiles(self) -> bool:
        """Whether a new bucket runs compiled: a `CompiledPrefill` that has not failed."""
        return self.prefill is not None and self.prefill.failure is None

    def _build(self, n: int) -> _Packed:
        """The bucket's buffers and, with `capture`, its graph: the compiling
        forward first (with a `CompiledPrefill`), two warm-up forwards on a
        side stream, then the capture; a compiled forward that fails in any
        of them is recorded and the eager one captured instead."""
        st = self._static(n)
        self._buckets[n] = st
        st.compiled = self._compiles()
        if not self.capture:
            return st
        if self.binder is not None:  # warm-up and capture: the sink's slot, a first chunk of n tokens
            from unikv.sim.real.state import PAD_SLOT

            self._set_chunk(PAD_SLOT, n, True)
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if st.compiled:
            try:
                self._warm_up(st)  # the first forward compiles (a failure falls back to eager inside)
                if not self._compiles():
                    raise RuntimeError(f"compile: {self.prefill.failure}")
                self._capture(st)
                return st
            except Exception as exc:  # any error of the compiled code: the eager forward instead
                self.compile_failures[n] = compile_error(exc)
                st.compiled = False
        try:
            self._warm_up(st)
            self._capture(st)
        except RuntimeError as exc:  # a forward that cannot be captured: this bucket runs its buffers eagerly
            self.failures[n] = compile_error(exc)
        return st

    def _warm_up(self, st: _Packed) -> None:
        """Two forwards of the bucket's buffers on a side stream, before its capture."""
        warm_up(self.device, lambda: self._forward(st))

    def _capture(self, st: _Packed) -> None:
        """Capture the bucket's forward as its graph, in the shared pool."""
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool):
            out = self._forward(st)
        if st.compiled and not self._compiles():  # the compiled forward failed inside: eager was captured
            st.compiled = False
            self.compile_failures[st.tokens] = f"capture: {self.prefill.failure}"
        st.graph, st.out = graph, out

    def stats(self) -> dict:
        """Buckets built and captured, steps run through captured and
        uncaptured buckets, steps no bucket took, why a capture failed
        (bucket -> error), and with a `CompiledPrefill` the buckets that run
        compiled (none once its compiled forward failed: its `failure` says
        why) and why a bucket gave its compiled forward up."""
        built = self._buckets
        out = {"buckets": sorted(built), "captured": sorted(n for n, b in built.items() if b.graph is not None),
               "steps_captured": sum(b.steps for b in built.values() if b.graph is not None),
               "steps_uncaptured": sum(b.steps for b in built.values() if b.graph is None),
               "fallbacks": self.fallbacks, "failures": dict(self.failures)}
        if self.prefill is not None:  # once the compiled forward has failed, every bucket runs eagerly
            out.update(compiled=sorted(n for n, b in built.items() if b.compiled and self._compiles()),
                       compile_failures=dict(self.compile_failures))
        return out
