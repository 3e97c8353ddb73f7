"""Triton page-table kernels: bind, alloc_bind, free_unbind, remap_moved.

Each launcher keeps the contract of its torch reference
(`unikv.kernels.tables.reference`), checks shapes, dtypes and devices with
one-line ValueErrors, and never reads device memory on the host (no
device->host sync). Virtual and physical page ids in one call are assumed
unique, as the allocator guarantees (checking it would need a host read).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from unikv.kernels.launch import (
    cdiv,
    check_same_device,
    check_same_length,
    check_table,
    check_tensor,
    contiguous,
    fast_ok,
    runs_triton,
)
from unikv.kernels.tables import reference

BLOCK = 1024  # ids per program: table kernels are tiny scatters


@triton.jit
def _bind_kernel(v_ptr, p_ptr, v2p_ptr, p2v_ptr, n, start, FROM_RANGE: tl.constexpr,
                 START_PTR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(v_ptr + offs, mask=mask, other=0)
    if FROM_RANGE:
        if START_PTR:  # noqa: SIM108 (a constexpr branch: one side is compiled)
            p = offs.to(tl.int64) + tl.load(start)
        else:
            p = offs.to(tl.int64) + start
        tl.store(p_ptr + offs, p, mask=mask)
    else:
        p = tl.load(p_ptr + offs, mask=mask, other=0)
    tl.store(v2p_ptr + v, p, mask=mask)
    tl.store(p2v_ptr + p, v, mask=mask)


@triton.jit
def _free_unbind_kernel(v_ptr, out_ptr, v2p_ptr, p2v_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(v_ptr + offs, mask=mask, other=0)
    p = tl.load(v2p_ptr + v, mask=mask, other=-1)
    tl.store(out_ptr + offs, p, mask=mask)
    tl.store(v2p_ptr + v, tl.full(v.shape, -1, tl.int64), mask=mask)
    # An unbound page (-1) has no p2v entry to clear: never scatter to -1.
    tl.store(p2v_ptr + p, tl.full(p.shape, -1, tl.int64), mask=mask & (p >= 0))


@triton.jit
def _remap_gather_kernel(src_ptr, out_ptr, p2v_ptr, n, BLOCK: tl.constexpr):
    # Phase 1: read the virtual page at each source, then clear the source.
    # Sources are unique, so no other program touches these entries.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(src_ptr + offs, mask=mask, other=0)
    v = tl.load(p2v_ptr + s, mask=mask, other=-1)
    tl.store(out_ptr + offs, v, mask=mask)
    tl.store(p2v_ptr + s, tl.full(s.shape, -1, tl.int64), mask=mask)


@triton.jit
def _remap_scatter_kernel(dst_ptr, v_ptr, v2p_ptr, p2v_ptr, n, BLOCK: tl.constexpr):
    # Phase 2 (a separate launch, so every source was read and cleared first).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(dst_ptr + offs, mask=mask, other=0)
    v = tl.load(v_ptr + offs, mask=mask, other=-1)
    tl.store(p2v_ptr + d, v, mask=mask)
    tl.store(v2p_ptr + v, d, mask=mask & (v >= 0))


def _tables(op: str, v2p: torch.Tensor, p2v: torch.Tensor, **ids: torch.Tensor) -> None:
    if fast_ok(v2p, p2v, *ids.values()):
        return
    check_table(v2p, "v2p", op)
    check_table(p2v, "p2v", op)
    for name, t in ids.items():
        check_tensor(t, name, op)
    check_same_device(op, v2p=v2p, p2v=p2v, **ids)


def bind(v_pages: torch.Tensor, p_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> None:
    """Bind `v_pages[i] <-> p_pages[i]` in both tables (see `reference.bind`).

    Raises:
        ValueError: for non-int64 or non-1-D ids, different lengths or
            devices, or non-contiguous tables.
    """
    _tables("bind", v2p, p2v, v_pages=v_pages, p_pages=p_pages)
    n = check_same_length("bind", v_pages=v_pages, p_pages=p_pages)
    if n == 0:
        return
    if not runs_triton(_bind_kernel, v2p):
        return reference.bind(v_pages, p_pages, v2p, p2v)
    _bind_kernel[(cdiv(n, BLOCK),)](contiguous(v_pages), contiguous(p_pages), v2p, p2v, n, 0,
                                   FROM_RANGE=False, START_PTR=False, BLOCK=BLOCK)


def alloc_bind(v_pages: torch.Tensor, start, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Bind `v_pages[i] <-> start + i` in one launch; return the physical
    pages `[start, start + n)` (see `reference.alloc_bind`).

    Args:
        start: a host int >= 0, or a one-element int64 tensor on the tables'
            device (read by the kernel, not the host).
    Raises:
        ValueError: as `bind`, or for a negative or ill-typed `start`.
    """
    op = "alloc_bind"
    _tables(op, v2p, p2v, v_pages=v_pages)
    start_ptr = isinstance(start, torch.Tensor)
    if start_ptr:
        check_tensor(start, "start", op, dim=None)
        if start.numel() != 1:
            raise ValueError(f"{op}: start has {start.numel()} elements; expected 1")
        check_same_device(op, v2p=v2p, start=start)
    elif isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"{op}: start={start!r} must be an int >= 0 or a one-element int64 tensor")
    n = int(v_pages.numel())
    out = torch.empty(n, dtype=torch.int64, device=v2p.device)
    if n == 0:
        return out
    if not runs_triton(_bind_kernel, v2p):
        return reference.alloc_bind(v_pages, start, v2p, p2v)
    _bind_kernel[(cdiv(n, BLOCK),)](contiguous(v_pages), out, v2p, p2v, n,
                                   contiguous(start) if start_ptr else start,
                                   FROM_RANGE=True, START_PTR=start_ptr, BLOCK=BLOCK)
    return out


def free_unbind(v_pages: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Tombstone `v_pages` in both tables; return the physical pages they
    held (see `reference.free_unbind`). No host read.

    Raises:
        ValueError: for non-int64 or non-1-D ids, mixed devices, or
            non-contiguous tables.
    """
    _tables("free_unbind", v2p, p2v, v_pages=v_pages)
    n = int(v_pages.numel())
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=v2p.device)
    if not runs_triton(_free_unbind_kernel, v2p):
        return reference.free_unbind(v_pages, v2p, p2v)
    out = torch.empty(n, dtype=torch.int64, device=v2p.device)
    _free_unbind_kernel[(cdiv(n, BLOCK),)](contiguous(v_pages), out, v2p, p2v, n, BLOCK=BLOCK)
    return out


def remap_moved(src: torch.Tensor, dst: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor) -> torch.Tensor:
    """Rebind the virtual pages held at `src` to `dst` after a page move
    (see `reference.remap_moved`); `src` and `dst` may overlap. Two launches:
    gather-and-clear every source, then scatter every destination.

    Raises:
        ValueError: for non-int64 or non-1-D ids, different lengths or
            devices, or non-contiguous tables.
    """
    op = "remap_moved"
    _tables(op, v2p, p2v, src=src, dst=dst)
    n = check_same_length(op, src=src, dst=dst)
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=v2p.device)
    if not runs_triton(_remap_gather_kernel, v2p):
        return reference.remap_moved(src, dst, v2p, p2v)
    v = torch.empty(n, dtype=torch.int64, device=v2p.device)
    grid = (cdiv(n, BLOCK),)
    _remap_gather_kernel[grid](contiguous(src), v, p2v, n, BLOCK=BLOCK)
    _remap_scatter_kernel[grid](contiguous(dst), v, v2p, p2v, n, BLOCK=BLOCK)
    return v
