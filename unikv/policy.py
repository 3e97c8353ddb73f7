"""Shortfall policy: the ladder and the float relocation, over a chain.

A demand vector maps band index -> pages the failed allocation needs on that
band (every token band for a coupled alloc, in alloc order; one band for a
state slot). The float moves only on a plan checked on extents first: the
ladder asks, then acts, so a ladder that fails leaves at least the room it
found (docs/allocator.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from unikv.chain import Chain
from unikv.extent import (
    Extent,
    Kind,
    bound_above,
    bound_below,
    demand_fits,
    float_region,
    joint_pages,
    relocated,
    room_extent,
    search,
    take_all,
)
from unikv.layout import Side
from unikv.stats import Stats


def flush_targets(chain: Chain, demand: Mapping[int, int]) -> list:
    """END bands whose urgent flush can raise the room of this allocation.

    A coupled alloc: every END band (a one-sided hole is useless to a
    coupled page, compaction turns it into shared gap). A single END band:
    the END bands on its growth side up to and including the first one.
    Never the float: absorbing its boundary holes turns pages only it could
    use into gap a neighbour competes for, so its absorption is part of the
    relocation plan instead (`open_short_side`).
    """
    wanted = [i for i, pages in demand.items() if pages > 0]
    if len(wanted) != 1 or chain.bands[wanted[0]].kind is Kind.FLOAT:
        return [b for b in chain.bands if b.kind is not Kind.FLOAT]
    i = wanted[0]
    step = 1 if chain.bands[i].kind is Kind.UP else -1
    out = []
    j = i + step
    while 0 <= j < len(chain.bands):
        if chain.bands[j].kind is not Kind.FLOAT:
            out.append(chain.bands[j])
            break
        j += step
    return out


def flush_chain(chain: Chain, urgent: bool, order: Sequence[int]) -> int:
    """Flush every END band, then let the float absorb its boundary holes
    unless that lowers the joint room of the coupled bands `order` (so a
    flush never shrinks `available_size()`); returns page moves."""
    f = chain.float_index()
    moves = 0
    for i, b in enumerate(chain.bands):
        if i != f:
            moves += b.flush(urgent)
    if f is None:
        return moves
    plan = chain.bands[f].plan_absorb()
    if plan is not None and order:
        ext = chain.extents()
        after = list(ext)
        after[f] = relocated(ext[f], plan)
        # Feasibility is monotone in n: the absorbed chain keeps the room
        # iff today's joint pages still fit on it (one walk, no search).
        if take_all(after, order, chain.joint_pages(order), chain.total_bytes) is None:
            return moves
    return moves + chain.bands[f].flush(urgent)


def open_short_side(chain: Chain, demand: Mapping[int, int]) -> bool:
    """Slide the float so the demand fits, if some planned slide does.

    Each candidate is a `make_room` request; its plan is checked on extents
    (`demand_fits`) and the first that fits is applied. Returns whether one
    was applied; if none fits, nothing moves.
    """
    f = chain.float_index()
    plan = slide_plan(chain, chain.extents(), demand) if f is not None else None
    if plan is None:
        return False
    chain.bands[f].relocate(plan)
    return True


def slide_plan(chain: Chain, ext: Sequence, demand: Mapping[int, int]):
    """The float relocation `open_short_side` would apply on a chain whose
    extents are `ext` (the float's own as now), or None: pure, nothing moves."""
    f = chain.float_index()
    if f is None or ext[f].transparent:
        return None
    holes = sorted(chain.bands[f].holes.tolist())
    request = slide_request(chain, ext, demand, holes)
    return None if request is None else chain.bands[f].plan_room(*request, ext)


def slide_request(chain: Chain, ext: Sequence, demand: Mapping[int, int],
                  holes: Sequence[int]) -> tuple[Side, int, int] | None:
    """The first room request (`_room_requests` order) whose planned float
    span lets `demand` fit, or None. Spans are counted by `room_extent` from
    the float's holes sorted ascending (`holes`), so a capacity search can
    ask for many demands without building a plan; `plan_room` then builds
    the one applied (the same span: tested)."""
    f = chain.float_index()
    if f is None or ext[f].transparent:
        return None
    band, e = chain.bands[f], ext[f]
    region = float_region(ext, f, chain.total_bytes)
    pages = lambda b: -(-b // e.page_bytes)  # noqa: E731  (as plan_room rounds)
    for side, min_bytes, keep_far_bytes in _room_requests(ext, chain.total_bytes, demand, f):
        span = room_extent(band.low, band.high, holes, region, side, pages(min_bytes),
                           pages(keep_far_bytes))
        if span is None:
            continue
        trial = list(ext)
        trial[f] = Extent(e.kind, e.page_bytes, e.min_page, e.num_pages, span[0], span[1], span[2],
                          e.live, e.cap)
        if demand_fits(trial, demand, chain.total_bytes):
            return side, min_bytes, keep_far_bytes
    return None


def ladder_joint_pages(chain: Chain, order: Sequence[int], hint: int = 0) -> int:
    """Pages a coupled take on `order` gets through the shortfall ladder:
    after urgent flushes of the END bands, then, if that is short, the
    float slide the ladder would plan. Every answer is realised by `relieve`
    (same extents, same plan); a search over a predicate that need not be
    monotone in `n` still only returns values it found to fit. `hint` (the
    last answer) is where the plain search starts: it never changes that
    search's exact answer, from which the slide search then starts."""
    ext = chain.extents(schedulable=True)
    total = chain.total_bytes
    plain = joint_pages(ext, order, total, hint)
    f = chain.float_index()
    if f is None or ext[f].transparent or not order:
        return plain

    holes = sorted(chain.bands[f].holes.tolist())  # once for the whole search

    def fits(n: int) -> bool:
        return (take_all(ext, order, n, total) is not None
                or slide_request(chain, ext, {i: n for i in order}, holes) is not None)

    free = total - chain.sink_bytes - sum(e.live * e.page_bytes for e in ext)
    hi = free // max(1, min(ext[i].page_bytes for i in order)) + sum(ext[i].holes for i in order)
    return search(fits, hi, plain)


def _room_requests(ext: Sequence, total_bytes: int, demand: Mapping[int, int],
                   f: int) -> Iterator[tuple[Side, int, int]]:
    """(side, min_bytes, keep_far_bytes) requests, most likely first.

    Each END band's need beyond its own holes falls on the float side facing
    it. If one side is short, open it (plus the float's own need the other
    side cannot cover); if only the float is short, consolidate its free
    bytes on the larger-surplus side. Each request comes with and without a
    page of slack (grid alignment), keeping the far side's need free, then
    without that limit. Last, on that side (or, when both or neither side is
    short by this count, the side with the larger need), every free page of
    the region: the float packed against the far neighbour.
    """
    if not any(p > 0 for p in demand.values()):
        return
    flt = ext[f]
    need = {Side.LOW: 0, Side.HIGH: 0}
    for i, pages in demand.items():
        if i != f and pages > 0:
            side = Side.LOW if i < f else Side.HIGH
            need[side] += max(0, pages - ext[i].holes) * ext[i].page_bytes
    gap = {
        Side.LOW: max(0, flt.low_byte - bound_below(ext, f)),
        Side.HIGH: max(0, bound_above(ext, f, total_bytes) - flt.high_byte),
    }
    surplus = {s: gap[s] - need[s] for s in Side}
    own = max(0, demand.get(f, 0) - flt.holes) * flt.page_bytes
    slack = max(ext[i].page_bytes for i, p in demand.items() if p > 0)
    short = [s for s in Side if surplus[s] < 0]
    if len(short) == 1:
        s = short[0]
        base = need[s] + max(0, own - max(0, surplus[s.other]))
    elif not short and own > max(surplus.values()):
        s = Side.LOW if surplus[Side.LOW] >= surplus[Side.HIGH] else Side.HIGH
        base = need[s] + own
    else:  # both sides short, or neither by this count: only the last resort
        s, base = (Side.LOW if need[Side.LOW] > need[Side.HIGH] else Side.HIGH), None
    if base is not None:
        for keep in (need[s.other], 0):
            yield s, base + slack, keep
            yield s, base, keep
    # Last resort: every free page of the float's region on that side (the
    # float packed against the far neighbour, its holes closed). Moving
    # boundary pages into the float's own holes turns pages only the float
    # can use into gap, so the requests above can fall short of a coupled
    # demand that this one fits (checked, like every candidate, before
    # anything moves).
    lo, hi = float_region(ext, f, total_bytes)
    yield s, (hi - lo - flt.live) * flt.page_bytes, 0


def relieve(chain: Chain, demand: Mapping[int, int], fits: Callable[[], bool], stats: Stats) -> bool:
    """The shortfall ladder, cheapest remedy first: urgent flushes of END
    bands, re-check, a float relocation planned to fit, re-check. Each step
    leaves every capacity view at least where it was, so a failing ladder
    never shrinks the room. Never evicts: the caller decides that."""
    stats.ladder_runs += 1
    for band in flush_targets(chain, demand):
        band.flush(urgent=True)
    if fits():
        return True
    if open_short_side(chain, demand) and fits():
        return True
    stats.ladder_failures += 1
    return False
