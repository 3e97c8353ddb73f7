"""Shortfall policy: the ladder and the float relocation, over a chain.

A demand vector maps band index -> pages the failed allocation needs on that
band (every token band for a coupled alloc; one band for a state slot).
"""

from __future__ import annotations

from typing import Callable, Mapping

from unikv.chain import Chain
from unikv.extent import Kind, bound_above, bound_below
from unikv.layout import Side
from unikv.stats import Stats


def flush_targets(chain: Chain, demand: Mapping[int, int]) -> list:
    """Bands whose flush can raise the room of this allocation.

    A coupled alloc: every band (a one-sided hole is useless to a coupled
    page, compaction turns it into shared gap; the float's flush absorbs its
    boundary holes). A single END band: the bands on its growth side up to
    and including the first END band there (its own holes already count).
    """
    wanted = [i for i, pages in demand.items() if pages > 0]
    if len(wanted) != 1 or chain.bands[wanted[0]].kind is Kind.FLOAT:
        return list(chain.bands)
    i = wanted[0]
    step = 1 if chain.bands[i].kind is Kind.UP else -1
    out = []
    j = i + step
    while 0 <= j < len(chain.bands):
        out.append(chain.bands[j])
        if chain.bands[j].kind is not Kind.FLOAT:
            break
        j += step
    return out


def open_short_side(chain: Chain, demand: Mapping[int, int]) -> None:
    """Slide the float so the side that is short of bytes gets them.

    Each END band's need beyond its own holes falls on the float side facing
    it. If both sides are short, relocation is zero-sum and nothing is done;
    if one is, that side is opened (plus the float's own need the far side
    cannot cover); if only the float is short, its larger-surplus side is
    consolidated. One page of slack covers grid alignment.
    """
    f = chain.float_index()
    if f is None or not any(p > 0 for p in demand.values()):
        return
    ext = chain.extents()
    flt = ext[f]
    if flt.transparent:
        return
    need = {Side.LOW: 0, Side.HIGH: 0}
    for i, pages in demand.items():
        if i != f and pages > 0:
            side = Side.LOW if i < f else Side.HIGH
            need[side] += max(0, pages - ext[i].holes) * ext[i].page_bytes
    gap = {
        Side.LOW: max(0, flt.low_byte - bound_below(ext, f)),
        Side.HIGH: max(0, bound_above(ext, f, chain.total_bytes) - flt.high_byte),
    }
    surplus = {s: gap[s] - need[s] for s in Side}
    own = max(0, demand.get(f, 0) - flt.holes) * flt.page_bytes
    slack = max(ext[i].page_bytes for i, p in demand.items() if p > 0)
    band = chain.bands[f]
    short = [s for s in Side if surplus[s] < 0]
    if len(short) == 2:
        return
    if short:
        s = short[0]
        band.make_room(s, need[s] + max(0, own - max(0, surplus[s.other])) + slack)
    elif own > max(surplus.values()):
        s = Side.LOW if surplus[Side.LOW] >= surplus[Side.HIGH] else Side.HIGH
        band.make_room(s, need[s] + own + slack)


def relieve(chain: Chain, demand: Mapping[int, int], fits: Callable[[], bool], stats: Stats) -> bool:
    """The shortfall ladder, cheapest remedy first: urgent flushes, re-check,
    float relocation, re-check. Never evicts: the caller decides that."""
    stats.ladder_runs += 1
    for band in flush_targets(chain, demand):
        band.flush(urgent=True)
    if fits():
        return True
    open_short_side(chain, demand)
    if fits():
        return True
    stats.ladder_failures += 1
    return False
