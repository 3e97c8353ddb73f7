"""Plain-torch references of the paged-alloc kernels: paged_extend, paged_decode.

Tail-page reuse in virtual id space, as paged serving engines hand out
slots: a request's new tokens first fill the free slots after `last_loc` on
its last page, then take fresh virtual pages, consumed request by request in
batch order. The allocator's host twins (`unikv.paged`) equal these.
"""

from __future__ import annotations

import torch


def new_page_counts(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages each request needs: ceil(seq / ps) - ceil(prefix / ps)."""
    return (seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size


def paged_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    new_pages: torch.Tensor,
    page_size: int,
    total_tokens: int | None = None,
) -> torch.Tensor:
    """Virtual token ids for positions `[prefix, seq)` of every request.

    Tail-page reuse: positions inside the prefix's last, partly filled page
    follow `last_loc` on that page; later positions take the fresh virtual
    pages `new_pages`, consumed request by request in batch order. Every
    temporary lives on the inputs' device.

    Args:
        prefix_lens, seq_lens, last_loc: int64 [bs]; `last_loc` is the id of
            each request's last prefix token (ignored where prefix is a
            multiple of page_size).
        new_pages: int64 [sum(new_page_counts)], the fresh virtual pages.
        total_tokens: sum(seq - prefix) when the caller knows it (spares a
            device-to-host read).
    Returns:
        int64 [sum(seq - prefix)] virtual token ids, request-major.
    """
    dev = seq_lens.device
    ext = seq_lens - prefix_lens
    total = int(ext.sum()) if total_tokens is None else int(total_tokens)
    req = torch.repeat_interleave(torch.arange(len(ext), device=dev), ext, output_size=total)
    starts = torch.cumsum(ext, 0) - ext
    pos = prefix_lens[req] + (torch.arange(total, device=dev) - starts[req])
    old_pages = (prefix_lens + page_size - 1) // page_size
    counts = new_page_counts(prefix_lens, seq_lens, page_size)
    page_base = torch.cumsum(counts, 0) - counts
    in_tail = pos < old_pages[req] * page_size
    tail_ids = last_loc[req] + (pos - prefix_lens[req] + 1)
    k = page_base[req] + torch.div(pos, page_size, rounding_mode="floor") - old_pages[req]
    k = torch.where(in_tail, torch.zeros_like(k), k)
    fresh = new_pages[k] * page_size + pos % page_size if new_pages.numel() else tail_ids
    return torch.where(in_tail, tail_ids, fresh)


def paged_decode(
    seq_lens: torch.Tensor, last_loc: torch.Tensor, new_pages: torch.Tensor, page_size: int
) -> torch.Tensor:
    """One new token per request at position `seq - 1` (decode's extend):
    `last_loc + 1` inside the tail page, else the next fresh page's slot 0."""
    pos = seq_lens - 1
    opens = pos % page_size == 0
    if new_pages.numel() == 0:
        return last_loc + 1
    k = torch.cumsum(opens, 0) - 1
    fresh = new_pages[k.clamp_(min=0)] * page_size
    return torch.where(opens, fresh, last_loc + 1)
