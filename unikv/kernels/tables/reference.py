"""Plain-torch references of the page-table kernels: bind, alloc_bind,
free_unbind, remap_moved.

Tables are 1-D int64 tensors: `v2p[v]` is the physical page bound to
virtual page `v` (-1 when unbound), `p2v[p]` the inverse. Entry 0 of both
maps to the sink. Ids in one call are unique (the allocator's guarantee).
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
