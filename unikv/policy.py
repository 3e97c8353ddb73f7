"""Shortfall policy: the ladder's and the float's decisions, as plans.

Pure functions over the chain's extents (and the float's hole list, passed
as data): they decide, and return what to do; the pool applies it (band
flushes, a float relocation) and re-checks. Nothing here holds a chain or a
band. A demand vector maps band index -> pages the failed allocation needs
on that band (every token band for a coupled alloc, in alloc order; one
band for a state slot). The float moves only on a plan checked on extents
first: the ladder asks, then acts, so a ladder that fails leaves at least
the room it found (docs/allocator.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from unikv.extent import (
    FLOAT,
    UP,
    Extent,
    Relocation,
    bound_above,
    bound_below,
    demand_fits,
    float_region,
    joint_fits,
    joint_pages,
    room_extent,
    room_plan,
    search,
)
from unikv.layout import Side


def flush_targets(ext: Sequence[Extent], demand: Mapping[int, int]) -> list[int]:
    """Indices of the END bands whose urgent flush can raise the room of
    this allocation, in chain order (`ext`: the chain's extents).

    A coupled alloc: every END band (a one-sided hole is useless to a
    coupled page, compaction turns it into shared gap). A single END band:
    the END bands on its growth side up to and including the first one.
    Never the float: absorbing its boundary holes turns pages only it could
    use into gap a neighbour competes for, so its absorption is part of the
    relocation plan instead (`slide_plan`).
    """
    wanted = [i for i, pages in demand.items() if pages > 0]
    if len(wanted) != 1 or ext[wanted[0]].kind is FLOAT:
        return [i for i, e in enumerate(ext) if e.kind is not FLOAT]
    i = wanted[0]
    step = 1 if ext[i].kind is UP else -1
    j = i + step
    while 0 <= j < len(ext):
        if ext[j].kind is not FLOAT:
            return [j]
        j += step
    return []


def absorb_keeps_room(ext: Sequence[Extent], f: int, span: tuple[int, int, int] | None,
                      order: Sequence[int], pages: int, total_bytes: int) -> bool:
    """Whether float `f` may apply its absorb in a flush, the absorb leaving
    `span` (low, high, holes: `FloatBand.absorb_span`): it keeps the
    coupled bands `order` able to take `pages` (today's joint pages, so a
    flush never shrinks `available_size()`), or there is nothing to keep
    (no absorb, no coupled band)."""
    if span is None or not order:
        return True
    e = ext[f]
    after = list(ext)
    after[f] = Extent(e.kind, e.page_bytes, e.min_page, e.num_pages, span[0], span[1], span[2], e.live, e.cap)
    # Feasibility is monotone in n: the absorbed chain keeps the room iff
    # today's joint pages still fit on it (one walk or a closed form, no search).
    return joint_fits(after, order, pages, total_bytes)


def slide_plan(ext: Sequence[Extent], f: int, float_holes: np.ndarray,
               demand: Mapping[int, int], total_bytes: int) -> Relocation | None:
    """The float relocation that lets `demand` fit on a chain whose extents
    are `ext` (float `f`'s holes: `float_holes`, any order), or None when no
    planned slide does: the first `slide_request` that fits, built as
    `room_plan` builds it (the same span: tested)."""
    if ext[f].transparent:
        return None
    holes = sorted(float_holes.tolist())
    request = slide_request(ext, f, holes, demand, total_bytes)
    if request is None:
        return None
    side, min_bytes, keep_far_bytes = request
    e = ext[f]
    pages = lambda b: -(-b // e.page_bytes)  # noqa: E731  (as slide_request rounds)
    return room_plan(e.low, e.high, holes, float_region(ext, f, total_bytes), side,
                     pages(min_bytes), pages(keep_far_bytes))


def slide_request(ext: Sequence[Extent], f: int, holes: Sequence[int],
                  demand: Mapping[int, int], total_bytes: int) -> tuple[Side, int, int] | None:
    """The first room request `(side, min_bytes, keep_far_bytes)`
    (`_room_requests` order) whose planned span of float `f` lets `demand`
    fit, or None. Spans are counted by `room_extent` from the float's holes
    sorted ascending (`holes`), so a capacity search can ask for many
    demands without building a plan."""
    e = ext[f]
    if e.transparent:
        return None
    region = float_region(ext, f, total_bytes)
    pages = lambda b: -(-b // e.page_bytes)  # noqa: E731  (as room_plan's callers round)
    for side, min_bytes, keep_far_bytes in _room_requests(ext, total_bytes, demand, f):
        span = room_extent(e.low, e.high, holes, region, side, pages(min_bytes),
                           pages(keep_far_bytes))
        if span is None:
            continue
        trial = list(ext)
        trial[f] = Extent(e.kind, e.page_bytes, e.min_page, e.num_pages, span[0], span[1], span[2],
                          e.live, e.cap)
        if demand_fits(trial, demand, total_bytes):
            return side, min_bytes, keep_far_bytes
    return None


def ladder_joint_pages(ext: Sequence[Extent], order: Sequence[int], f: int | None,
                       float_holes: np.ndarray, total_bytes: int, sink_bytes: int,
                       hint: int = 0) -> int:
    """Pages a coupled take on `order` gets through the shortfall ladder:
    after urgent flushes of the END bands (`ext`: the chain's schedulable
    extents, `extents(schedulable=True)`), then, if that is short, the
    float slide the ladder would plan (float `f`, None if none; its holes
    `float_holes`, any order). Every answer is realised by the ladder (same
    extents, same plan); a search over a predicate that need not be
    monotone in `n` still only returns values it found to fit. `hint` (the
    last answer) is where the plain search starts: it never changes that
    search's exact answer, from which the slide search then starts."""
    plain = joint_pages(ext, order, total_bytes, hint)
    if f is None or ext[f].transparent or not order:
        return plain

    holes = np.sort(float_holes).tolist()  # ascending, as `sorted` would list them (a vector sort)

    def fits(n: int) -> bool:
        return (joint_fits(ext, order, n, total_bytes)
                or slide_request(ext, f, holes, {i: n for i in order}, total_bytes) is not None)

    free = total_bytes - sink_bytes - sum(e.live * e.page_bytes for e in ext)
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
