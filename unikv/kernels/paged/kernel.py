"""Triton paged-alloc kernels: `paged_decode` and `paged_extend`.

Same outputs as the torch references in `unikv.kernels.paged.reference`
(tail-page reuse in virtual id space): a request's new tokens first fill the free
slots after `last_loc` on its last page, then take the fresh virtual pages
`new_pages`, consumed request by request in batch order.

`paged_decode` is one launch of one program (a running sum over the batch
hands out the fresh pages). `paged_extend` is two launches: one program scans
the batch (token and page offsets), then a grid over output tokens finds each
token's request by binary search. Neither reads device memory on the host
when the caller passes `total_tokens` to `paged_extend`.
"""

from __future__ import annotations

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
    next_pow2,
    runs_triton,
)
from unikv.kernels.paged import reference

SCAN_BLOCK = 1024  # requests per step of the one-program scans
TOKEN_BLOCK = 256  # output tokens per program of paged_extend


@triton.jit
def _paged_decode_kernel(seq_ptr, last_ptr, pages_ptr, out_ptr, bs, n_pages, page_size, BLOCK: tl.constexpr):
    taken = tl.sum(tl.zeros([BLOCK], dtype=tl.int64), axis=0)  # fresh pages handed out so far
    for start in range(0, bs, BLOCK):
        i = start + tl.arange(0, BLOCK)
        mask = i < bs
        seq = tl.load(seq_ptr + i, mask=mask, other=1)
        last = tl.load(last_ptr + i, mask=mask, other=0)
        prefix = seq - 1
        need = mask & (prefix % page_size == 0)
        need64 = need.to(tl.int64)
        k = taken + tl.cumsum(need64, axis=0) - need64
        page = tl.load(pages_ptr + k, mask=need & (k < n_pages), other=0)
        tl.store(out_ptr + i, tl.where(need, page * page_size, last + 1), mask=mask)
        taken += tl.sum(need64, axis=0)


@triton.jit
def _paged_scan_kernel(prefix_ptr, seq_ptr, ends_ptr, base_ptr, bs, page_size, BLOCK: tl.constexpr):
    # ends[i]: inclusive running sum of new tokens; base[i]: exclusive
    # running sum of new pages (ceil(seq / ps) - ceil(prefix / ps)).
    tokens = tl.sum(tl.zeros([BLOCK], dtype=tl.int64), axis=0)
    pages = tl.sum(tl.zeros([BLOCK], dtype=tl.int64), axis=0)
    for start in range(0, bs, BLOCK):
        i = start + tl.arange(0, BLOCK)
        mask = i < bs
        prefix = tl.load(prefix_ptr + i, mask=mask, other=0)
        seq = tl.load(seq_ptr + i, mask=mask, other=0)
        ext = seq - prefix
        count = (seq + page_size - 1) // page_size - (prefix + page_size - 1) // page_size
        tl.store(ends_ptr + i, tokens + tl.cumsum(ext, axis=0), mask=mask)
        tl.store(base_ptr + i, pages + tl.cumsum(count, axis=0) - count, mask=mask)
        tokens += tl.sum(ext, axis=0)
        pages += tl.sum(count, axis=0)


@triton.jit
def _paged_extend_kernel(prefix_ptr, last_ptr, pages_ptr, ends_ptr, base_ptr, out_ptr, total, bs, n_pages,
                         page_size, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = t < total
    t64 = t.to(tl.int64)
    # Request of token t: the number of requests whose inclusive end <= t.
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = tl.zeros([BLOCK], dtype=tl.int32) + bs
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        end = tl.load(ends_ptr + mid, mask=mask & active, other=0)
        right = end <= t64
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (end > t64), mid, hi)
    req = tl.minimum(lo, bs - 1)
    prefix = tl.load(prefix_ptr + req, mask=mask, other=0)
    run_start = tl.load(ends_ptr + req - 1, mask=mask & (req > 0), other=0)
    j = t64 - run_start  # position of t inside its request's run
    pos = prefix + j
    old_pages = (prefix + page_size - 1) // page_size
    in_tail = pos < old_pages * page_size
    tail = tl.load(last_ptr + req, mask=mask & in_tail, other=0) + j + 1
    k = tl.load(base_ptr + req, mask=mask, other=0) + pos // page_size - old_pages
    page = tl.load(pages_ptr + k, mask=mask & (~in_tail) & (k >= 0) & (k < n_pages), other=0)
    tl.store(out_ptr + t, tl.where(in_tail, tail, page * page_size + pos % page_size), mask=mask)


def _check(op: str, page_size: int, **tensors: torch.Tensor) -> int:
    batch = {k: v for k, v in tensors.items() if k != "new_pages"}
    if fast_ok(*tensors.values()) and type(page_size) is int and page_size > 0:
        n = {int(t.numel()) for t in batch.values()}
        if len(n) == 1:
            return n.pop()
    for name, t in tensors.items():
        check_tensor(t, name, op)
    check_same_device(op, **tensors)
    check_positive(page_size, "page_size", op)
    return check_same_length(op, **batch)


def paged_decode(seq_lens: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor,
                 page_size: int) -> torch.Tensor:
    """One new virtual token id per request, at position `seq - 1`.

    Args:
        seq_lens, last_loc: int64 [bs]; seq includes the new token.
        new_pages: int64 [number of requests with (seq - 1) % ps == 0].
    Returns:
        int64 [bs]. One launch, no host read.
    Raises:
        ValueError: for non-int64 / non-1-D inputs, mixed devices, unequal
            batch lengths or a non-positive page_size.
    """
    bs = _check("paged_decode", page_size, seq_lens=seq_lens, last_loc=last_loc, new_pages=new_pages)
    out = torch.empty(bs, dtype=torch.int64, device=seq_lens.device)
    if bs == 0:
        return out
    if not runs_triton(_paged_decode_kernel, seq_lens):
        return reference.paged_decode(seq_lens, last_loc, new_pages, page_size)
    block = min(next_pow2(bs), SCAN_BLOCK)
    _paged_decode_kernel[(1,)](contiguous(seq_lens), contiguous(last_loc), contiguous(new_pages), out, bs,
                               new_pages.numel(), page_size, BLOCK=block)
    return out


def paged_extend(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                 new_pages: torch.Tensor, page_size: int, total_tokens: int | None = None) -> torch.Tensor:
    """Virtual token ids for positions `[prefix, seq)` of every request,
    request-major (see `reference.paged_extend`).

    Args:
        prefix_lens, seq_lens, last_loc: int64 [bs].
        new_pages: int64 [sum(new_page_counts)].
        total_tokens: sum(seq - prefix) when the caller knows it; None reads
            it from the device (one host sync).
    Returns:
        int64 [total_tokens]. Two launches.
    Raises:
        ValueError: as `paged_decode`, or for a negative total_tokens.
    """
    op = "paged_extend"
    bs = _check(op, page_size, prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc,
                new_pages=new_pages)
    dev = seq_lens.device
    if total_tokens is None:
        total_tokens = int((seq_lens - prefix_lens).sum()) if bs else 0
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 0:
        raise ValueError(f"{op}: total_tokens={total_tokens!r} must be an int >= 0")
    out = torch.empty(total_tokens, dtype=torch.int64, device=dev)
    if total_tokens == 0 or bs == 0:
        return out
    if not runs_triton(_paged_extend_kernel, seq_lens):
        return reference.paged_extend(prefix_lens, seq_lens, last_loc, new_pages, page_size,
                                                   total_tokens)
    prefix, seq = contiguous(prefix_lens), contiguous(seq_lens)
    scan = torch.empty(2, bs, dtype=torch.int64, device=dev)
    _paged_scan_kernel[(1,)](prefix, seq, scan[0], scan[1], bs, page_size, BLOCK=min(next_pow2(bs), SCAN_BLOCK))
    steps = max(1, int(bs).bit_length())
    _paged_extend_kernel[(cdiv(total_tokens, TOKEN_BLOCK),)](
        prefix, contiguous(last_loc), contiguous(new_pages), scan[0], scan[1], out, total_tokens, bs,
        new_pages.numel(), page_size, STEPS=steps, BLOCK=TOKEN_BLOCK)
    return out
