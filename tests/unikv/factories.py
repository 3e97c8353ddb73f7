"""Small layouts with hand-checkable geometry, shared by the core tests."""

from __future__ import annotations

import numpy as np
import torch

from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend


def one_band(grow: str = "up", page_size: int = 1, total: int = 1000, entry: int = 100) -> Layout:
    """sink 100 B (ps 1) -> pages 1..9 usable of a 10-page grid."""
    return Layout(total_bytes=total, bands=[Band("full", entry_bytes=entry, grow=grow, page_size=page_size)])


def full_swa(page_size: int = 1, total: int = 10_000) -> Layout:
    """full grows up (200 B/token), swa grows down (100 B/token); sink 200 B."""
    return Layout(total_bytes=total, bands=[
        Band("full", entry_bytes=200, grow="up", page_size=page_size),
        Band("swa", entry_bytes=100, grow="down", page_size=page_size),
    ])


def mamba_full(page_size: int = 1, total: int = 10_000) -> Layout:
    """mamba state 1000 B grows up; full 200 B/token grows down; sink 1000 B."""
    return Layout(total_bytes=total, bands=[
        Band("mamba", entry_bytes=1000, grow="up", unit="request"),
        Band("full", entry_bytes=200, grow="down", page_size=page_size),
    ])


def three_band(page_size: int = 1, total: int = 10_000) -> Layout:
    """mamba 1000 B (up) | swa 100 B (float) | full 200 B (down); sink 1000 B.

    Grids: mamba pages 1..9 of 10; swa pages 10..99 of 100; full 5..49 of 50
    (page_size 1).
    """
    return Layout(total_bytes=total, bands=[
        Band("mamba", entry_bytes=1000, grow="up", unit="request"),
        Band("swa", entry_bytes=100, grow="float", page_size=page_size),
        Band("full", entry_bytes=200, grow="down", page_size=page_size),
    ])


def pool(layout: Layout, compaction: str = "lazy", kind: str = "unified", ids: str = "torch", **kw):
    """A materialised pool of `kind` ("unified", "static", "oracle").

    `ids="torch"` (not the sim backend's native numpy): these tests read and
    write bytes through tensors (`fill`, `read`); the numpy path has its own
    tests (test_ids_kinds.py, test_light_install.py).
    """
    if kind == "oracle":
        return OraclePool(layout, backend=SimBackend(materialize=False), ids=ids)
    backend = SimBackend(materialize=True)
    if kind == "static":
        return StaticPartitionPool(layout, backend=backend, ids=ids, **kw)
    return UnifiedPool(layout, backend=backend, compaction=compaction, ids=ids, **kw)


def fill(pool, ids: torch.Tensor, band: str, seed: int) -> torch.Tensor:
    """Write a pattern into the slots of `ids` on `band`; return it."""
    view = pool.buffer_view(band)
    slots = pool.translate(ids, band)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (len(slots), view.shape[1]), generator=gen, dtype=torch.uint8)
    view[slots] = data
    return data


def read(pool, ids: torch.Tensor, band: str) -> torch.Tensor:
    return pool.buffer_view(band)[pool.translate(ids, band)]


def snapshot(pool) -> dict:
    """Everything a rejected call must leave unchanged."""
    out = {"occ": pool.occupancy(), "avail": pool.available_size(), "free": pool.vids.free.copy(),
           "forward": (id(pool.hazards.event), {k: w.tolist() for k, w in pool.hazards.writes.items()})}
    for name, b in pool.bands.items():
        out[name] = (b.v2p.copy(), b.p2v.copy())
    if pool.buffer is not None:
        out["bytes"] = np.array(pool.buffer, copy=True)  # the sim backend's buffer is numpy
    return out


def same(a: dict, b: dict) -> bool:
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, tuple):
            if not all(np.array_equal(p, q) for p, q in zip(x, y)):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True
