"""The paged alloc surface: argument checks and page arithmetic.

Serving engines hand a batch as per-request `prefix_lens` (tokens already
held), `seq_lens` (tokens wanted) and `last_loc` (id of the last prefix
token). New tokens first fill the free slots of the last page, then take
`ceil(seq / ps) - ceil(prefix / ps)` new pages per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unikv.ids import as_ids, check_range, few
from unikv.kernels.reference import new_page_counts


@dataclass(frozen=True)
class PagedRequest:
    prefix: torch.Tensor
    seq: torch.Tensor
    last_loc: torch.Tensor
    new_pages: int


def extend_request(pool, prefix_lens, seq_lens, last_loc, extend_num_tokens=None) -> PagedRequest:
    """Checked arguments of `alloc_extend`. Raises ValueError naming the
    argument (shapes, negative or shrinking lengths, a wrong token total, a
    `last_loc` that is not a live id at the prefix's last position)."""
    dev = pool.backend.device
    prefix = as_ids(prefix_lens, "alloc_extend: prefix_lens", dev)
    seq = as_ids(seq_lens, "alloc_extend: seq_lens", dev)
    last = as_ids(last_loc, "alloc_extend: last_loc", dev)
    if not (prefix.numel() == seq.numel() == last.numel()):
        raise ValueError(
            f"alloc_extend: prefix_lens, seq_lens, last_loc have lengths "
            f"{prefix.numel()}, {seq.numel()}, {last.numel()}; expected equal"
        )
    if prefix.numel() and bool((prefix < 0).any()):
        raise ValueError(f"alloc_extend: prefix_lens {few(prefix[prefix < 0])} are negative")
    if seq.numel() and bool((seq < prefix).any()):
        raise ValueError(f"alloc_extend: seq_lens {few(seq[seq < prefix])} are below prefix_lens")
    total = int((seq - prefix).sum())
    if extend_num_tokens is not None and int(extend_num_tokens) != total:
        raise ValueError(f"alloc_extend: extend_num_tokens={extend_num_tokens} but "
                         f"sum(seq_lens - prefix_lens)={total}")
    _check_last_loc(pool, prefix, last, "alloc_extend")
    pages = int(new_page_counts(prefix, seq, pool.page_size).sum())
    return PagedRequest(prefix, seq, last, pages)


def decode_request(pool, seq_lens, last_loc) -> PagedRequest:
    """Checked arguments of `alloc_decode` (seq_lens >= 1, include the new token)."""
    dev = pool.backend.device
    seq = as_ids(seq_lens, "alloc_decode: seq_lens", dev)
    last = as_ids(last_loc, "alloc_decode: last_loc", dev)
    if seq.numel() != last.numel():
        raise ValueError(f"alloc_decode: seq_lens and last_loc have lengths "
                         f"{seq.numel()}, {last.numel()}; expected equal")
    if seq.numel() and int(seq.min()) < 1:
        raise ValueError(f"alloc_decode: seq_lens {few(seq[seq < 1])} must be >= 1")
    prefix = seq - 1
    _check_last_loc(pool, prefix, last, "alloc_decode")
    ps = pool.page_size
    pages = int((prefix % ps == 0).sum()) if ps > 1 else int(seq.numel())
    return PagedRequest(prefix, seq, last, pages)


def _check_last_loc(pool, prefix: torch.Tensor, last: torch.Tensor, op: str) -> None:
    ps = pool.page_size
    if ps == 1 or prefix.numel() == 0:
        return
    # One fused check on the happy path; offenders are listed only on error.
    tail = prefix % ps != 0
    in_range = (last >= 0) & (last < pool.vids.size * ps)
    safe = torch.where(in_range, last, torch.zeros_like(last))
    at_end = safe % ps == (prefix - 1) % ps
    live = pool.vids.binds[torch.div(safe, ps, rounding_mode="floor")] > 0
    if not bool((tail & ~(in_range & at_end & live)).any()):
        return
    check_range(last[tail], 0, pool.vids.size * ps, f"{op}: last_loc")
    wrong = last[tail & ~at_end]
    if wrong.numel():
        raise ValueError(f"{op}: last_loc {few(wrong)} do not sit at the prefix's last "
                         f"position within their page (page_size={ps})")
    raise ValueError(f"{op}: last_loc {few(last[tail & ~live])} are not on allocated pages")


def page_representatives(ids: torch.Tensor, start_pos: int, page_size: int) -> torch.Tensor:
    """One id per page of a contiguous run starting at position `start_pos`:
    the first id, then one every `page_size` from the next page boundary."""
    if page_size == 1 or ids.numel() == 0:
        return ids
    offset = start_pos % page_size
    if offset == 0:
        return ids[::page_size]
    return torch.cat([ids[:1], ids[page_size - offset::page_size]])
