"""Read-only views of a pool: occupancy bytes and binding checks."""

from __future__ import annotations

import numpy as np

from unikv.extent import BUDGET, FLOAT, REGION
from unikv.layout import Unit

BandUsage = tuple[int, int, int, int, int, int]  # live, hole, pending, occupied, low, high bytes


def usage(pool) -> tuple[int, int, tuple[BandUsage, ...]]:
    """`(free_bytes, gap_bytes, bands)`: the buffer's free bytes (total -
    sink - live), the chain's gap bytes, and per band in chain order
    `(live_bytes, hole_bytes, pending_bytes, occupied_bytes, low_byte,
    high_byte)`. A transparent float or a budget band occupies no bytes
    (low = high = 0); a static region occupies its whole region."""
    chain = pool.chain
    bands = []
    live_total = 0
    for b, e in zip(chain.bands, chain.extents()):
        pb, kind = e.page_bytes, e.kind
        live = e.live * pb
        live_total += live
        if kind is BUDGET or (kind is FLOAT and not live):  # transparent
            low = high = 0
        else:
            low, high = e.low * pb, (e.cap if kind is REGION else e.high) * pb
        bands.append((live, e.holes * pb, b.pending_pages() * pb, high - low, low, high))
    return chain.total_bytes - chain.sink_bytes - live_total, chain.gap_bytes(), tuple(bands)


def occupancy(pool) -> dict:
    """`usage` as nested dicts keyed by band name, with page counts and
    transparency beside the bytes; plus the buffer's total and sink bytes."""
    free, gap, bands = usage(pool)
    out = {}
    for b, e, (live, holes, pending, occupied, low, high) in zip(
            pool.chain.bands, pool.chain.extents(), bands):
        pb = e.page_bytes
        out[b.name] = {
            "low_byte": low,
            "high_byte": high,
            "occupied_bytes": occupied,
            "live_pages": live // pb,
            "hole_pages": holes // pb,
            "pending_pages": pending // pb,
            "live_bytes": live,
            "hole_bytes": holes,
            "pending_bytes": pending,
            "transparent": e.transparent,
        }
    layout = pool.layout
    return {
        "total_bytes": layout.total_bytes,
        "sink_bytes": layout.sink_bytes,
        "gap_bytes": gap,
        "free_bytes": free,
        "bands": out,
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
