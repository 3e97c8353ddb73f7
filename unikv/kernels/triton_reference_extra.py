"""Torch references for kernel contracts that `reference.py` lacks.

- `alloc_bind`: bind fresh virtual pages to one contiguous physical range.
- `paged_extend` / `paged_decode`: the same contract as
  `reference.paged_extend` / `reference.paged_decode`, written so that every
  temporary lives on the inputs' device (the originals build `torch.arange`
  on the CPU, so they only run on CPU tensors). The CUDA backend falls back
  to these when Triton is missing.

Candidates to move into `reference.py` (see docs/kernels.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from unikv.kernels import reference


def alloc_bind(v_pages: torch.Tensor, start, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Bind `v_pages[i] <-> start + i` in both tables; return the physical
    pages `[start, start + len(v_pages))` (int64, on the tables' device).

    `start` is a host int or a one-element int64 device tensor (so a start
    computed on the device needs no host read).
    """
    n = int(v_pages.numel())
    offsets = torch.arange(n, dtype=torch.int64, device=v2p.device)
    p_pages = offsets + (start.reshape(()) if isinstance(start, torch.Tensor) else int(start))
    reference.bind(v_pages, p_pages, v2p, p2v)
    return p_pages


def paged_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    new_pages: torch.Tensor,
    page_size: int,
    total_tokens: Optional[int] = None,
) -> torch.Tensor:
    """`reference.paged_extend` on any device; `total_tokens` (=
    sum(seq - prefix), when the caller knows it) spares a host read."""
    dev = seq_lens.device
    ext = seq_lens - prefix_lens
    total = int(ext.sum()) if total_tokens is None else int(total_tokens)
    req = torch.repeat_interleave(torch.arange(len(ext), device=dev), ext, output_size=total)
    starts = torch.cumsum(ext, 0) - ext
    pos = prefix_lens[req] + (torch.arange(total, device=dev) - starts[req])
    old_pages = (prefix_lens + page_size - 1) // page_size
    counts = reference.new_page_counts(prefix_lens, seq_lens, page_size)
    page_base = torch.cumsum(counts, 0) - counts
    in_tail = pos < old_pages[req] * page_size
    tail_ids = last_loc[req] + (pos - prefix_lens[req] + 1)
    k = page_base[req] + torch.div(pos, page_size, rounding_mode="floor") - old_pages[req]
    k = torch.where(in_tail, torch.zeros_like(k), k)
    fresh = new_pages[k] * page_size + pos % page_size if new_pages.numel() else tail_ids
    return torch.where(in_tail, tail_ids, fresh)


def paged_decode(seq_lens: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor,
                 page_size: int) -> torch.Tensor:
    """`reference.paged_decode` on any device, with no host read."""
    return paged_extend(seq_lens - 1, seq_lens, last_loc, new_pages, page_size,
                        total_tokens=int(seq_lens.numel()))
