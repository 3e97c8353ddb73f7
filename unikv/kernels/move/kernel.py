"""Triton page-move kernel: copy page rows `src[i] -> dst[i]` of one band's grid.

Contract (same as `unikv.kernels.move.reference.move_pages`): the result is
as if every source row were read before any destination row is written, so
an overlapping ordered shift is allowed.

How: a disjoint batch (no source is also a destination) is one launch that
grids over (page groups x chunks of a page) and copies with the widest word
the page size and the buffer's alignment allow (int64 words make 16-byte
vector loads when rows are 16-byte aligned). An overlapping batch is planned
on the host (`unikv.kernels.move.plan`): disjoint waves for long shifts, or
rounds of at most three launches that stage through a temp buffer for short
ones.
Deciding needs the page lists on the host: one device->host read unless the
caller passes `disjoint=True`.

Bounded grid (`max_programs`): every launch has at most that many programs,
each looping over the work items (tiles) `pid, pid + grid, ...`. A move
issued on a side stream then holds only a few SMs while it runs, and the
forward's kernels keep the rest; a full grid (the default) takes every SM
until its last tile is done, so the forward's next kernels wait for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
import triton
import triton.language as tl

from unikv.kernels.launch import (
    cdiv,
    check_positive,
    check_same_device,
    check_same_length,
    check_tensor,
    contiguous,
    fast_ok,
    interpreted,
    next_pow2,
)
from unikv.kernels.move import reference
from unikv.kernels.move.plan import Copy, plan_moves

STAGE_BYTES = 256 << 20  # most bytes one staging round holds in its temp buffer
TILE_BYTES = 16 << 10  # bytes one program copies
NUM_WARPS = 4
STREAMING = False  # evict-first loads and streaming stores


class Tune(TypedDict):
    """`copy_rows`' launch settings, passed on as keywords."""

    tile_bytes: int
    num_warps: int
    streaming: bool
    max_programs: int | None


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, src_rows_ptr, dst_rows_ptr, n_rows, row_elems, chunks_per_row,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr, STREAMING: tl.constexpr):
    # Work item -> (group of ROWS rows, chunk of BLOCK words of each row);
    # program pid takes items pid, pid + grid, ... (one item on a full grid).
    n_work = tl.cdiv(n_rows, ROWS) * chunks_per_row
    for work in tl.range(tl.program_id(0), n_work, tl.num_programs(0)):
        group = work // chunks_per_row
        chunk = work - group * chunks_per_row
        r = group * ROWS + tl.arange(0, ROWS)
        rmask = r < n_rows
        s = tl.load(src_rows_ptr + r, mask=rmask, other=0)
        d = tl.load(dst_rows_ptr + r, mask=rmask, other=0)
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        mask = rmask[:, None] & (cols < row_elems)[None, :]
        src = src_ptr + (s * row_elems)[:, None] + cols[None, :]
        dst = dst_ptr + (d * row_elems)[:, None] + cols[None, :]
        if STREAMING:  # each byte is touched once: keep it out of the caches' way
            x = tl.load(src, mask=mask, eviction_policy="evict_first")
            tl.store(dst, x, mask=mask, cache_modifier=".cs")
        else:
            x = tl.load(src, mask=mask)
            tl.store(dst, x, mask=mask)


_INTERPRETED = interpreted(_copy_rows_kernel)  # kernels run on CPU tensors too

# -- word width and tiling --

_WORDS = ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))


def word_view(buffer: torch.Tensor, page_bytes: int) -> tuple[torch.Tensor, int]:
    """The page grid of `buffer` as a flat tensor of the widest word that
    divides `page_bytes` and the buffer's address; returns (view, word bytes)."""
    ptr, size = buffer.data_ptr(), buffer.numel()
    for dtype, width in _WORDS:
        if page_bytes % width == 0 and ptr % width == 0:
            grid = buffer if size % width == 0 else buffer[: size // page_bytes * page_bytes]
            return grid.view(dtype), width
    raise AssertionError("unreachable: uint8 always fits")


@dataclass(frozen=True)
class Tiling:
    """Launch shape of one copy: ROWS rows x BLOCK words per program."""

    rows: int
    block: int
    chunks_per_row: int
    num_warps: int

    def work(self, n_rows: int) -> int:
        """Tiles (work items) of a copy of `n_rows` rows."""
        return cdiv(n_rows, self.rows) * self.chunks_per_row

    def grid(self, n_rows: int, max_programs: int | None = None) -> tuple[int]:
        """One program per tile, or at most `max_programs` looping over them."""
        work = self.work(n_rows)
        return (work if max_programs is None else min(work, max_programs),)


@functools.lru_cache(maxsize=256)
def tiling(row_elems: int, word_bytes: int, tile_bytes: int = TILE_BYTES, num_warps: int = NUM_WARPS) -> Tiling:
    """Whole rows per program for small pages; chunks of one row for large."""
    tile_words = max(1, tile_bytes // word_bytes)
    block = next_pow2(row_elems)
    if block >= tile_words:
        return Tiling(1, tile_words, cdiv(row_elems, tile_words), num_warps)
    block = max(block, 16)
    return Tiling(max(1, tile_words // block), block, 1, num_warps)


def copy_rows(src_flat: torch.Tensor, src_rows: torch.Tensor, dst_flat: torch.Tensor, dst_rows: torch.Tensor,
              row_elems: int, tile_bytes: int = TILE_BYTES, num_warps: int = NUM_WARPS,
              streaming: bool = STREAMING, max_programs: int | None = None) -> None:
    """One launch: rows `src_rows[i]` of `src_flat` -> rows `dst_rows[i]` of
    `dst_flat` (flat tensors of one word dtype, rows of `row_elems` words),
    on at most `max_programs` programs (None: one per tile).
    Sources must not be written by this launch."""
    n = int(src_rows.numel())
    if n == 0:
        return
    t = tiling(row_elems, src_flat.element_size(), tile_bytes, num_warps)
    _copy_rows_kernel[t.grid(n, max_programs)](src_flat, dst_flat, src_rows, dst_rows, n, row_elems,
                                               t.chunks_per_row, ROWS=t.rows, BLOCK=t.block,
                                               STREAMING=streaming, num_warps=t.num_warps)


# -- launcher --


def move_pages(buffer: torch.Tensor, page_bytes: int, src: torch.Tensor, dst: torch.Tensor, *,
               disjoint: bool | None = None, host_pages: tuple | None = None,
               stage_bytes: int = STAGE_BYTES, max_programs: int | None = None,
               tile_bytes: int = TILE_BYTES, num_warps: int = NUM_WARPS, streaming: bool = STREAMING) -> None:
    """Copy page rows `src[i] -> dst[i]` on the grid of `page_bytes` pages.

    Args:
        buffer: 1-D contiguous uint8 tensor.
        page_bytes: bytes per page (any positive size).
        src, dst: int64 [n] page indices on the buffer's device.
        disjoint: True promises no source is a destination (one launch, no
            host read, no checks of the page values); None (default) reads
            the pages to the host once and plans the launches (and checks
            the pages lie on the grid); False is treated as None.
        host_pages: `(src, dst)` as host int arrays equal to the device
            ones, when the caller has them: the plan is made from these and
            the host read is skipped.
        stage_bytes: most temp bytes one staging round uses.
        max_programs: most programs (CTAs) per launch, each looping over
            its share of the tiles; None (default): one program per tile.
            A small bound leaves most SMs to kernels of other streams. The
            torch reference (CPU without the interpreter) ignores it.
    Raises:
        ValueError: for bad dtypes, shapes or devices, a `max_programs` that
            is not a positive int or None, a page off the grid or a repeated
            destination (the last two only when checked).
    """
    if max_programs is not None:
        check_positive(max_programs, "max_programs", "move_pages")
    n = _check_move(buffer, page_bytes, src, dst)
    if n == 0:
        return
    src, dst = contiguous(src), contiguous(dst)  # the kernel reads them raw
    if not (buffer.is_cuda or _INTERPRETED):
        return reference.move_pages(buffer, page_bytes, src, dst)
    flat, width = word_view(buffer, page_bytes)
    row_elems = page_bytes // width
    tune = Tune(tile_bytes=tile_bytes, num_warps=num_warps, streaming=streaming, max_programs=max_programs)
    if disjoint:
        return copy_rows(flat, src, flat, dst, row_elems, **tune)
    num_pages = buffer.numel() // page_bytes
    if host_pages is not None:
        hs, hd = (np.asarray(a, dtype=np.int64) for a in host_pages)
    else:
        hs, hd = torch.stack([src, dst]).cpu().numpy()  # the one host read
    off = (hs < 0) | (hs >= num_pages) | (hd < 0) | (hd >= num_pages)
    if off.any():
        bad = np.concatenate([hs[off], hd[off]])[:8].tolist()
        raise ValueError(f"move_pages: pages {bad} are outside the grid [0, {num_pages})")
    plan = plan_moves(hs, hd, max(1, stage_bytes // page_bytes), page_bytes)
    if len(plan) == 1:
        return copy_rows(flat, src, flat, dst, row_elems, **tune)
    _run_plan(plan, flat, row_elems, tune)


def _check_move(buffer, page_bytes, src, dst) -> int:
    """The batch length; ValueError naming the argument on bad input."""
    op = "move_pages"
    if (fast_ok(src, dst) and type(buffer) is torch.Tensor and buffer.dtype is torch.uint8
            and buffer.dim() == 1 and buffer.is_contiguous() and buffer.get_device() == src.get_device()
            and type(page_bytes) is int and page_bytes > 0 and src.shape == dst.shape):
        return src.shape[0]
    check_tensor(buffer, "buffer", op, dtype=torch.uint8)
    if not buffer.is_contiguous():
        raise ValueError(f"{op}: buffer must be contiguous")
    check_positive(page_bytes, "page_bytes", op)
    check_tensor(src, "src", op)
    check_tensor(dst, "dst", op)
    check_same_device(op, buffer=buffer, src=src, dst=dst)
    return check_same_length(op, src=src, dst=dst)


def _run_plan(plan: list[Copy], flat: torch.Tensor, row_elems: int, tune: Tune) -> None:
    """Launch a plan's copies in order, with one upload of all their indices."""
    dev = flat.device
    rows_of = lambda kind: max((c.src_rows.size for c in plan if kind in (c.src_kind, c.dst_kind)),  # noqa: E731
                               default=0)
    store = {
        "buffer": flat,
        "temp": torch.empty(rows_of("temp") * row_elems, dtype=flat.dtype, device=dev),
        "stash": torch.empty(rows_of("stash") * row_elems, dtype=flat.dtype, device=dev),
    }
    host = torch.from_numpy(np.concatenate([a for c in plan for a in (c.src_rows, c.dst_rows)]))
    if dev.type == "cuda":
        host = host.pin_memory()
    idx = host.to(dev, non_blocking=True)
    at = 0
    for c in plan:
        k = c.src_rows.size
        s, d = idx[at:at + k], idx[at + k:at + 2 * k]
        at += 2 * k
        copy_rows(store[c.src_kind], s, store[c.dst_kind], d, row_elems, **tune)
