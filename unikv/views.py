"""Read-only views of a pool: occupancy bytes and binding checks."""

from __future__ import annotations

import numpy as np

from unikv.extent import Kind
from unikv.layout import Unit


def occupancy(pool) -> dict:
    """Per band: frontiers and live / hole / pending / occupied bytes; plus
    the chain's gap bytes and the free bytes (total - sink - live)."""
    bands = {}
    live_total = 0
    for b, e in zip(pool.chain.bands, pool.chain.extents()):
        pb = e.page_bytes
        pending = b.pending_pages()
        if e.kind is Kind.BUDGET or e.transparent:
            low = high = 0
        else:
            low, high = e.low_byte, (e.cap if e.kind is Kind.REGION else e.high) * pb
        live_total += e.live * pb
        bands[b.name] = {
            "low_byte": low,
            "high_byte": high,
            "occupied_bytes": high - low,
            "live_pages": e.live,
            "hole_pages": e.holes,
            "pending_pages": pending,
            "live_bytes": e.live * pb,
            "hole_bytes": e.holes * pb,
            "pending_bytes": pending * pb,
            "transparent": e.transparent,
        }
    layout = pool.layout
    return {
        "total_bytes": layout.total_bytes,
        "sink_bytes": layout.sink_bytes,
        "gap_bytes": pool.chain.gap_bytes(),
        "free_bytes": layout.total_bytes - layout.sink_bytes - live_total,
        "bands": bands,
    }


def binding_violations(pool) -> list[str]:
    """Each id's bind count equals the number of bands that bind it."""
    out = []
    if pool.token_names:
        bound = sum((pool.bands[n].v2p[1:] >= 0).astype(np.int16) for n in pool.token_names)
        if not np.array_equal(bound, pool.vids.binds[1:]):
            out.append("[token ids] bind counts differ from the bands' tables")
    for b in pool.layout.bands:
        if b.unit is Unit.REQUEST:
            bound = (pool.bands[b.name].v2p[1:] >= 0).astype(np.int16)
            if not np.array_equal(bound, pool.state_ids[b.name].binds[1:]):
                out.append(f"[{b.name} ids] bind counts differ from the band's table")
    return out
