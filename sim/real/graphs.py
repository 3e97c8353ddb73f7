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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class _Bucket:
    """One bucket's static buffers (and, once captured, its graph and output)."""

    ids: Any
    pos: Any
    cu_q: Any
    seq_lens: Any
    rows: Any  # [n, max_pages] int64 virtual pages
    vids: Any  # [n] int64 virtual token ids written
    graph: Any = None
    out: Any = None
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
    """

    def __init__(self, model, views, bands: Sequence[str], *, device: str, max_pages: int,
                 buckets: Sequence[int] = BUCKETS, capture: bool | None = None) -> None:
        self.model = model
        self.views = views
        self.bands = tuple(bands)
        self.device = device
        self.max_pages = int(max_pages)
        self.buckets = tuple(sorted(buckets))
        self.capture = str(device).startswith("cuda") if capture is None else capture
        self._buckets: dict[int, _Bucket] = {}
        self.failures: dict[int, str] = {}  # bucket -> why its capture failed

    def bucket(self, batch_size: int) -> int | None:
        """The smallest bucket holding `batch_size` requests (None: none does)."""
        return next((n for n in self.buckets if n >= batch_size), None)

    def capture_buckets(self, max_batch: int) -> None:
        """Build (and on CUDA capture) every bucket a step of up to
        `max_batch` requests can use, as a serving engine does at start-up,
        so that no capture lands inside a step's measured time."""
        top = self.bucket(max_batch) or self.buckets[-1]
        for n in self.buckets:
            if n <= top and n not in self._buckets:
                self._build(n)

    def run(self, batch) -> Any:
        """Greedy next tokens `[B]` of a padded (decode-only) `StepBatch`, or
        None when no bucket fits it or it carries no virtual rows (a
        `readable` batch): the caller runs it eagerly."""
        b = len(batch.requests)
        n = self.bucket(b)
        if batch.layout != "padded" or n is None or batch.page_rows is None:
            return None
        width = int(batch.page_rows.shape[1])
        if width > self.max_pages:
            return None
        st = self._buckets.get(n) or self._build(n)
        self._fill(st, batch, b, width)
        st.steps += 1
        if st.graph is None:
            return self._forward(st)[:b]
        st.graph.replay()
        return st.out[:b]

    def _static(self, n: int) -> _Bucket:
        import torch

        dev = self.device
        return _Bucket(
            ids=torch.zeros((n, 1), dtype=torch.int64, device=dev),
            pos=torch.zeros((n, 1), dtype=torch.int64, device=dev),
            cu_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(n, dtype=torch.int32, device=dev),
            rows=torch.zeros((n, self.max_pages), dtype=torch.int64, device=dev),
            vids=torch.zeros(n, dtype=torch.int64, device=dev))

    def _fill(self, st: _Bucket, batch, b: int, width: int) -> None:
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
        if live_b > b:  # rows the last step used and this one pads
            st.ids[b:live_b].zero_()
            st.pos[b:live_b].zero_()
            st.seq_lens[b:live_b].fill_(1)
            st.rows[b:live_b].zero_()
            st.vids[b:live_b].zero_()
        if live_w > width:  # columns past this step's widest request
            st.rows[:min(b, live_b), width:live_w].zero_()
        st.filled = (b, width)

    def _forward(self, st: _Bucket) -> Any:
        from unikv.sim.real.attention import StepContext, use_step

        # inside the capture: the pool's device tables are read at replay time (committed by the batch build)
        tables = {band: self.views.translate_pages(st.rows, band) for band in self.bands}
        slots = {band: self.views.translate_slots(st.vids, band) for band in self.bands}
        ctx = StepContext(views=self.views, block_tables=tables, cu_q=st.cu_q, seq_lens=st.seq_lens,
                          write_slots=slots, layout="padded")
        with use_step(ctx):
            logits = self.model(input_ids=st.ids, position_ids=st.pos, use_cache=False).logits
        return logits[:, -1].argmax(-1)

    def _build(self, n: int) -> _Bucket:
        """The bucket's buffers and, with `capture`, its graph: two warm-up
        forwards on a side stream, then the capture (the padding rows write
        only the sink, so warm-up and capture touch no live KV)."""
        st = self._static(n)
        self._buckets[n] = st
        if not self.capture:
            return st
        import torch

        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                self._forward(st)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.inference_mode(), torch.cuda.graph(graph):
                st.out = self._forward(st)
        except RuntimeError as exc:
            # a forward that syncs or changes shape with the data (transformers'
            # eager MoE loops over the experts hit) cannot be captured: this
            # bucket runs its static buffers eagerly, and the stats say why
            self.failures[n] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            st.out = None
            return st
        st.graph = graph
        return st

    def stats(self) -> dict:
        """Buckets built, steps run through them, buckets captured as graphs,
        and why a capture failed (bucket -> the error's first line)."""
        return {"buckets": sorted(self._buckets), "steps": sum(b.steps for b in self._buckets.values()),
                "captured": sorted(n for n, b in self._buckets.items() if b.graph is not None),
                "failures": dict(self.failures)}
