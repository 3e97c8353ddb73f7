"""Plain-torch reference implementations of the kernel contracts.

Tables are int64 tensors: `v2p[v]` is the physical page bound to virtual page
`v` (-1 when unbound), `p2v[p]` the inverse. Entry 0 of both maps to the sink.
"""

from __future__ import annotations

import torch


def bind(v_pages: torch.Tensor, p_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> None:
    """Bind `v_pages[i] <-> p_pages[i]` in both tables (same length, int64)."""
    v2p[v_pages] = p_pages
    p2v[p_pages] = v_pages


def alloc_bind(v_pages: torch.Tensor, start, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Bind `v_pages[i] <-> start + i` in both tables; return the physical
    pages `[start, start + len(v_pages))` (int64, on the tables' device).

    `start` is a host int or a one-element int64 device tensor (so a start
    computed on the device needs no host read).
    """
    offsets = torch.arange(int(v_pages.numel()), dtype=torch.int64, device=v2p.device)
    p_pages = offsets + (start.reshape(()) if isinstance(start, torch.Tensor) else int(start))
    bind(v_pages, p_pages, v2p, p2v)
    return p_pages


def free_unbind(v_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Tombstone `v_pages` in both tables; return the physical pages they held.

    Tombstones are written by index fills, never by a host scalar, so the
    call needs no device-to-host transfer.
    """
    p_pages = v2p.index_select(0, v_pages)
    v2p.index_fill_(0, v_pages, -1)
    p2v.index_fill_(0, p_pages, -1)
    return p_pages


def remap_moved(src: torch.Tensor, dst: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Rebind the virtual pages held at `src` to `dst` after a page move.

    `src` and `dst` may overlap (an ordered shift): the virtual ids are read
    before any entry is cleared. Returns the moved virtual pages.
    """
    v = p2v.index_select(0, src)
    p2v.index_fill_(0, src, -1)
    p2v[dst] = v
    v2p[v] = dst
    return v


def page_rows(buffer: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """`[num_pages, page_bytes]` uint8 view of `buffer` on a band's grid."""
    num_pages = buffer.numel() // page_bytes
    return buffer[: num_pages * page_bytes].view(num_pages, page_bytes)


def move_pages(buffer: torch.Tensor, page_bytes: int, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy page rows `src[i] -> dst[i]` on one band's grid.

    Result as if every source row were read before any destination row is
    written, so an overlapping ordered shift is allowed.
    """
    rows = page_rows(buffer, page_bytes)
    rows[dst] = rows[src]


def translate(
    v_tokens: torch.Tensor, v2p: torch.Tensor, page_size: int, multiplier: int = 1
) -> torch.Tensor:
    """Virtual token ids -> physical slot ids (`multiplier` 1) or
    kernel-facing ids (`multiplier` = blocks per page). Tombstones -> 0."""
    pages = torch.div(v_tokens, page_size, rounding_mode="floor")
    offsets = v_tokens - pages * page_size
    phys = v2p.index_select(0, pages)
    ids = phys * (page_size * multiplier) + offsets
    return torch.where(phys < 0, torch.zeros_like(ids), ids)


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
