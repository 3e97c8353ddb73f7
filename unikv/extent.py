"""Band arithmetic as pure functions over a small snapshot of the chain.

Every band reports an `Extent`: its kind, its page geometry, its occupied
page range and its hole / live counts. The functions here answer "where would
`n` more pages of band `i` go" without touching any allocator, so the same
code serves the real allocation (which then applies the answer) and the
capacity views (which search over hypothetical allocations). Because both run
this one function, `alloc(n)` succeeds for every `n` the capacity views admit.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from unikv.layout import Side


class Kind(enum.Enum):
    """How a band's occupied range behaves."""

    UP = "up"  # END band growing from the low end
    DOWN = "down"  # END band growing from the high end
    FLOAT = "float"  # movable span between neighbours; transparent when empty
    REGION = "region"  # fixed private byte region (static partition)
    BUDGET = "budget"  # no geometry, a share of one byte budget (oracle)


# The members as module constants: on CPython 3.11 `Kind.UP` costs an
# attribute lookup through the enum's metaclass (~0.1 µs), and the capacity
# arithmetic tests kinds in its inner loops.
UP, DOWN, FLOAT, REGION, BUDGET = Kind.UP, Kind.DOWN, Kind.FLOAT, Kind.REGION, Kind.BUDGET


class Extent(NamedTuple):
    """One band's state as the capacity arithmetic sees it.

    Attributes:
        kind: see `Kind`.
        page_bytes: bytes per page of this band.
        min_page: first page past the sink.
        num_pages: pages of the band's grid inside the buffer.
        low, high: occupied page range `[low, high)`. REGION: the region's
            first page and its fill watermark. BUDGET: unused (0, 0).
        holes: free pages inside the range that an alloc reuses first.
        live: bound pages.
        cap: REGION: the region's end page (its growth limit). BUDGET: the
            byte budget shared by all bands (buffer minus sink). Else 0.
    """

    kind: Kind
    page_bytes: int
    min_page: int
    num_pages: int
    low: int
    high: int
    holes: int
    live: int
    cap: int = 0

    @property
    def transparent(self) -> bool:
        """Occupies no bytes that a neighbour's walk must respect."""
        return self.kind is BUDGET or (self.kind is FLOAT and self.live == 0)

    @property
    def low_byte(self) -> int:
        return self.low * self.page_bytes

    @property
    def high_byte(self) -> int:
        return self.high * self.page_bytes


# `new_extent(Extent, (kind, page_bytes, min_page, num_pages, low, high,
# holes, live, cap))`: all nine fields, positional, without the Python frame
# of NamedTuple.__new__ (half the cost; extents are rebuilt at every
# mutation epoch and the capacity search builds them in its inner loop).
new_extent = tuple.__new__


def bound_below(chain: Sequence[Extent], i: int) -> int:
    """High byte of the nearest non-transparent band below `i` (0 if none)."""
    for j in range(i - 1, -1, -1):
        e = chain[j]
        if e.kind is not BUDGET and (e.kind is not FLOAT or e.live):  # not transparent
            return e.high * e.page_bytes
    return 0


def bound_above(chain: Sequence[Extent], i: int, total_bytes: int) -> int:
    """Low byte of the nearest non-transparent band above `i` (the buffer
    top if none)."""
    for j in range(i + 1, len(chain)):
        e = chain[j]
        if e.kind is not BUDGET and (e.kind is not FLOAT or e.live):  # not transparent
            return e.low * e.page_bytes
    return total_bytes


def float_region(chain: Sequence[Extent], i: int, total_bytes: int) -> tuple[int, int]:
    """Pages `[lo, hi)` of band `i`'s grid between its neighbours' frontiers
    (rounded inward: a page must fit wholly in the free bytes)."""
    e = chain[i]
    lo = max(e.min_page, -(-bound_below(chain, i) // e.page_bytes))
    hi = min(e.num_pages, bound_above(chain, i, total_bytes) // e.page_bytes)
    return lo, max(lo, hi)


def float_gaps(chain: Sequence[Extent], i: int, total_bytes: int) -> tuple[int, int]:
    """Free pages below and above float `i`'s span (both = the whole region
    when the float is transparent)."""
    lo, hi = float_region(chain, i, total_bytes)
    e = chain[i]
    if e.transparent:
        return hi - lo, hi - lo
    return max(0, e.low - lo), max(0, hi - e.high)


def extension_room(chain: Sequence[Extent], i: int, total_bytes: int) -> int:
    """Most fresh pages one take on band `i` can add beyond its holes."""
    e = chain[i]
    if e.kind is UP:
        return max(0, min(e.num_pages, bound_above(chain, i, total_bytes) // e.page_bytes) - e.high)
    if e.kind is DOWN:
        floor = max(e.min_page, -(-bound_below(chain, i) // e.page_bytes))
        return max(0, e.low - floor)
    if e.kind is FLOAT:
        return max(float_gaps(chain, i, total_bytes))
    if e.kind is REGION:
        return e.cap - e.high
    free = e.cap - sum(x.live * x.page_bytes for x in chain)
    # The budget is shared, but a band still has only its own page grid.
    return min(max(0, free) // e.page_bytes, e.num_pages - e.min_page - e.live)


def take(chain: Sequence[Extent], i: int, n: int, total_bytes: int) -> Extent | None:
    """Band `i`'s extent after taking `n` pages: holes first, then fresh
    pages at its growth frontier. None when they do not fit (no move allowed).

    A float extends toward the roomier gap, falling back to the other side;
    from transparent it centres itself in the free region.
    """
    e = chain[i]
    drain = min(n, e.holes)
    ext = n - drain
    low, high = e.low, e.high
    if ext:
        if ext > extension_room(chain, i, total_bytes):
            return None
        if e.kind is UP or e.kind is REGION:
            high += ext
        elif e.kind is DOWN:
            low -= ext
        elif e.kind is FLOAT:
            low, high = _float_extend(chain, i, ext, total_bytes)
    # Positional construction: NamedTuple._replace is several times slower,
    # and the capacity search calls this in its inner loop.
    return new_extent(Extent, (e.kind, e.page_bytes, e.min_page, e.num_pages, low, high,
                         e.holes - drain, e.live + n, e.cap))


def _float_extend(chain: Sequence[Extent], i: int, ext: int, total_bytes: int) -> tuple[int, int]:
    """The float's span after `ext` fresh pages (they fit: checked)."""
    e = chain[i]
    lo, hi = float_region(chain, i, total_bytes)
    if e.transparent:
        start = lo + (hi - lo - ext) // 2
        return start, start + ext
    gap_low, gap_high = e.low - lo, hi - e.high
    fits_high, fits_low = ext <= gap_high, ext <= gap_low
    if fits_high and (gap_high >= gap_low or not fits_low):
        return e.low, e.high + ext
    return e.low - ext, e.high


def take_all(
    chain: Sequence[Extent], order: Sequence[int], n: int, total_bytes: int
) -> list[Extent] | None:
    """The chain after taking `n` pages on each band of `order`, in that
    order; None if any does not fit."""
    out = list(chain)
    for i in order:
        e = take(out, i, n, total_bytes)
        if e is None:
            return None
        out[i] = e
    return out


def demand_fits(chain: Sequence[Extent], demand: Mapping[int, int], total_bytes: int) -> bool:
    """Whether a demand vector (band index -> pages, taken in its order)
    fits on `chain` without a move."""
    out = list(chain)
    for i, n in demand.items():
        if n > 0:
            e = take(out, i, n, total_bytes)
            if e is None:
                return False
            out[i] = e
    return True


def joint_fits(chain: Sequence[Extent], order: Sequence[int], n: int, total_bytes: int) -> bool:
    """Whether `n` pages fit on every band of `order` at once: `take_all`'s
    answer, read off a closed form of `joint_pages` where the chain has
    one (feasibility is monotone in `n`). `order` non-empty."""
    closed = _closed_joint_pages(chain, order)
    if closed is not None:
        return n <= closed
    return take_all(chain, order, n, total_bytes) is not None


def _closed_joint_pages(chain: Sequence[Extent], order: Sequence[int]) -> int | None:
    """`joint_pages` in closed form, or None for a chain that has none: the
    first band's kind picks the one form that can apply (a facing pair
    starts with its UP band, a float pair with its DOWN band, a budget
    with a budget band)."""
    first = chain[order[0]].kind
    if first is UP:
        return facing_pair_pages(chain, order)
    if first is DOWN:
        return float_pair_pages(chain, order)
    return budget_pages(chain, order) if first is BUDGET else None


def joint_pages(
    chain: Sequence[Extent], order: Sequence[int], total_bytes: int, hint: int = 0
) -> int:
    """Largest `n` such that `n` pages fit on every band of `order` at once.

    Feasibility is monotone in `n` (every band's fresh-page need grows with
    `n` and its room only shrinks as earlier bands extend), so a search over
    `take_all` is exact. It gallops out from `hint` (e.g. the previous
    answer, which moves little between calls) before bisecting. The common
    chains have a closed form instead (`facing_pair_pages`,
    `budget_pages`; tests hold them equal to the search).
    """
    if not order:
        return 0
    closed = _closed_joint_pages(chain, order)
    if closed is not None:
        return closed
    hi = min(chain[i].holes + extension_room(chain, i, total_bytes) for i in order)
    if len(order) == 1 or all(chain[i].kind is REGION for i in order):
        return hi  # independent bands: each one's own room is the answer
    return search(lambda n: take_all(chain, order, n, total_bytes) is not None, hi, hint)


def facing_pair_pages(chain: Sequence[Extent], order: Sequence[int]) -> int | None:
    """`joint_pages` of an UP band and a DOWN band that face each other
    (only transparent bands between, the UP band taken first), in closed
    form; None for any other `order`.

    Each band takes its holes first. Within both hole counts only each
    band's own room limits `n`; past both, every page extends both
    frontiers toward each other, and they meet where
    `(down.low + down.holes - n) * down_bytes >= (up.high - up.holes + n) * up_bytes`
    stops holding (the DOWN floor is the UP frontier rounded up to a DOWN
    page, so the byte inequality is exact).
    """
    if len(order) != 2:
        return None
    i, j = order
    u, d = chain[i], chain[j]
    if u.kind is not UP or d.kind is not DOWN or i > j:
        return None
    for k in range(i + 1, j):
        if not chain[k].transparent:
            return None
    pu, pd = u.page_bytes, d.page_bytes
    room_u = max(0, min(u.num_pages, d.low * pd // pu) - u.high)
    room_d = max(0, d.low - max(d.min_page, -(-u.high * pu // pd)))
    hi = min(u.holes + room_u, d.holes + room_d)
    meet = ((d.low + d.holes) * pd - (u.high - u.holes) * pu) // (pu + pd)
    return min(hi, max(u.holes, d.holes, meet))


def float_pair_pages(chain: Sequence[Extent], order: Sequence[int]) -> int | None:
    """`joint_pages` of a DOWN band taken first and the FLOAT band right
    below it (the end/float/end chain's token bands), in closed form; None
    for any other `order`, or a float lying below its own floor.

    The DOWN band takes its holes, then extends toward the float's high
    frontier (the float's floor when it is transparent): `n <= n_down`.
    The float takes its holes, then needs `n - holes` pages of one gap:
    the low gap (fixed: the DOWN band moves only the high one), or the
    high gap up to the DOWN band's new low frontier, which falls by
    `max(0, n - down.holes)`. That last test, `(n - holes + top) * pf <=
    (down.low - max(0, n - down.holes)) * pd` (`top`: the float's high
    page, or its floor page when transparent), only gets harder as `n`
    grows, so each test holds on a prefix of `n` and the answer is the
    largest `n` the DOWN band's test and either float test admit.
    """
    if len(order) != 2:
        return None
    j, i = order
    d, f = chain[j], chain[i]
    if d.kind is not DOWN or f.kind is not FLOAT or j != i + 1:
        return None
    pf, pd = f.page_bytes, d.page_bytes
    below = bound_below(chain, i)
    lo = max(f.min_page, -(-below // pf))  # the float's floor page
    if f.live:
        if f.high < lo:
            return None
        floor_d, top, side = max(d.min_page, -(-f.high * pf // pd)), f.high, max(0, f.low - lo)
    else:  # transparent: the DOWN band sees through to the float's floor
        floor_d, top, side = max(d.min_page, -(-below // pd)), lo, 0
    n_down = d.holes + max(0, d.low - floor_d)
    within = f.holes - top + d.low * pd // pf  # the high-gap test while the DOWN band drains holes
    if d.holes <= within:  # ... holds up to the DOWN band's holes: then both frontiers move
        within = ((d.low + d.holes) * pd + (f.holes - top) * pf) // (pf + pd)
    high_gap = min(within, f.num_pages - top + f.holes)
    return min(n_down, max(f.holes + side, high_gap))


def budget_pages(chain: Sequence[Extent], order: Sequence[int]) -> int | None:
    """`joint_pages` when every band of `order` draws on the byte budget,
    in closed form (None otherwise): `n` pages of each cost `n` times the
    sum of their page bytes, and each band keeps its own page grid."""
    bytes_per_n = 0
    grid = None
    for i in order:
        e = chain[i]
        if e.kind is not BUDGET:
            return None
        bytes_per_n += e.page_bytes
        room = e.num_pages - e.min_page - e.live
        grid = room if grid is None else min(grid, room)
    if grid is None:
        raise ValueError("budget_pages: order=() must name at least one band")
    free = chain[order[0]].cap - sum(x.live * x.page_bytes for x in chain)
    return max(0, min(free // bytes_per_n, grid))


# -- the closed forms over columns: `Columns` is one band's Extent fields
# "low", "high", "holes", "live" as int64 arrays, one entry per sampled
# state (`unikv.samples`); `ext0` gives the fields that never change (kind,
# page bytes, grid, cap). Each twin sits under its scalar form's test
# (`test_extent.test_column_twins_equal_the_scalar_forms`).

Columns = Mapping[str, np.ndarray]


def joint_pages_columns(ext0: Sequence[Extent], cols: Sequence[Columns],
                        order: Sequence[int]) -> np.ndarray | None:
    """`joint_pages` of every sampled state at once, for the chains it
    answers in closed form (a facing UP / DOWN pair, budget bands, static
    regions); None for any other chain (the caller then searches state by
    state). `order` non-empty."""
    kinds = [ext0[i].kind for i in order]
    if len(order) == 2 and kinds == [UP, DOWN] and order[1] == order[0] + 1:
        return facing_pair_columns(ext0[order[0]], cols[order[0]], ext0[order[1]], cols[order[1]])
    if len(order) == 2 and kinds == [DOWN, FLOAT] and order[0] == order[1] + 1:
        return float_pair_columns(ext0, cols, order[1])
    if all(k is BUDGET for k in kinds):
        return budget_columns(ext0, cols, order)
    if all(k is REGION for k in kinds):
        return np.min([cols[i]["holes"] + ext0[i].cap - cols[i]["high"] for i in order], axis=0)
    return None


def facing_pair_columns(u: Extent, su: Columns, d: Extent, sd: Columns) -> np.ndarray:
    """`facing_pair_pages` of adjacent bands `u` (UP) and `d` (DOWN), over columns."""
    pu, pd = u.page_bytes, d.page_bytes
    room_u = np.maximum(0, np.minimum(u.num_pages, sd["low"] * pd // pu) - su["high"])
    room_d = np.maximum(0, sd["low"] - np.maximum(d.min_page, -(-su["high"] * pu // pd)))
    hi = np.minimum(su["holes"] + room_u, sd["holes"] + room_d)
    meet = ((sd["low"] + sd["holes"]) * pd - (su["high"] - su["holes"]) * pu) // (pu + pd)
    return np.minimum(hi, np.maximum(np.maximum(su["holes"], sd["holes"]), meet))


def float_pair_columns(ext0: Sequence[Extent], cols: Sequence[Columns], i: int) -> np.ndarray | None:
    """`float_pair_pages` of float `i` and the DOWN band right above it,
    over columns; None when the band below the float is not an END band
    (its bound would need the scalar walk) or a sampled float lies below
    its floor."""
    f, d, sf, sd = ext0[i], ext0[i + 1], cols[i], cols[i + 1]
    pf, pd = f.page_bytes, d.page_bytes
    if i == 0:
        below: np.ndarray | int = 0
    elif ext0[i - 1].kind is UP or ext0[i - 1].kind is DOWN:  # never transparent
        below = cols[i - 1]["high"] * ext0[i - 1].page_bytes
    else:
        return None
    lo = np.maximum(f.min_page, -(-below // pf))
    live = sf["live"] > 0
    if bool((live & (sf["high"] < lo)).any()):
        return None
    floor_d = np.where(live, np.maximum(d.min_page, -(-sf["high"] * pf // pd)),
                       np.maximum(d.min_page, -(-below // pd)))
    top = np.where(live, sf["high"], lo)
    side = np.where(live, np.maximum(0, sf["low"] - lo), 0)
    n_down = sd["holes"] + np.maximum(0, sd["low"] - floor_d)
    within = sf["holes"] - top + sd["low"] * pd // pf
    both = ((sd["low"] + sd["holes"]) * pd + (sf["holes"] - top) * pf) // (pf + pd)
    high_gap = np.minimum(np.where(sd["holes"] <= within, both, within), f.num_pages - top + sf["holes"])
    return np.minimum(n_down, np.maximum(sf["holes"] + side, high_gap))


def budget_columns(ext0: Sequence[Extent], cols: Sequence[Columns], order: Sequence[int]) -> np.ndarray:
    """`budget_pages` over columns (every band of `order` a budget band)."""
    bytes_per_n = sum(ext0[i].page_bytes for i in order)
    grid = np.min([ext0[i].num_pages - ext0[i].min_page - cols[i]["live"] for i in order], axis=0)
    free = ext0[order[0]].cap - sum(c["live"] * e.page_bytes for e, c in zip(ext0, cols))
    return np.maximum(0, np.minimum(free // bytes_per_n, grid))


def search(fits, hi: int, hint: int) -> int:
    """Largest n in [0, hi] with `fits(n)` (monotone), galloping from `hint`."""
    lo, step = 0, 1
    probe = min(max(hint, 0), hi)
    if probe and fits(probe):
        lo = probe
        while lo < hi and fits(min(hi, lo + step)):
            lo, step = min(hi, lo + step), step * 2
        hi = min(hi, lo + step - 1) if lo < hi else lo
    elif probe:
        hi = probe - 1
        while hi > 0 and not fits(max(0, hi - step)):
            hi, step = max(0, hi - step) - 1, step * 2
        lo = max(0, hi - step)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def after_urgent_flush(e: Extent) -> Extent:
    """An END band's extent once an urgent flush packed it (holes reclaimed)."""
    if not e.holes or (e.kind is not UP and e.kind is not DOWN):
        return e
    low, high = (e.low, e.high - e.holes) if e.kind is UP else (e.low + e.holes, e.high)
    return new_extent(Extent, (e.kind, e.page_bytes, e.min_page, e.num_pages, low, high, 0, e.live, e.cap))


def chain_gap_bytes(chain: Sequence[Extent], sink_bytes: int, total_bytes: int) -> int:
    """Free bytes between consecutive non-transparent bands (and between a
    lone END band's frontier and the opposite buffer end). Static regions:
    the unfilled part of every region. Budget: none (only live and free)."""
    if chain and chain[0].kind is REGION:
        return sum((e.cap - e.high) * e.page_bytes for e in chain)
    gap = 0
    top = None  # high byte of the previous non-transparent band
    for e in chain:
        if e.kind is BUDGET or (e.kind is FLOAT and e.live == 0):
            continue  # transparent
        if top is None:  # the first: from the sink, unless the chain starts UP
            top = e.low * e.page_bytes if chain[0].kind is UP else sink_bytes
        gap += max(0, e.low * e.page_bytes - top)
        top = e.high * e.page_bytes
    if top is None:
        return 0
    if chain[-1].kind is not DOWN:
        gap += max(0, total_bytes - top)
    return gap


def chain_gap_bytes_columns(ext0: Sequence[Extent], cols: Sequence[Columns], sink_bytes: int,
                            total_bytes: int) -> np.ndarray:
    """`chain_gap_bytes` over columns (see `joint_pages_columns`)."""
    n = len(cols[0]["low"])
    if ext0[0].kind is REGION:
        return sum(((e.cap - c["high"]) * e.page_bytes for e, c in zip(ext0, cols)),
                   np.zeros(n, dtype=np.int64))
    gap = np.zeros(n, dtype=np.int64)
    top = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=bool)  # a non-transparent band came before
    for e, c in zip(ext0, cols):
        if e.kind is BUDGET:
            continue
        solid = c["live"] > 0 if e.kind is FLOAT else np.ones(n, dtype=bool)
        low = c["low"] * e.page_bytes
        first = low if ext0[0].kind is UP else sink_bytes
        start = np.where(seen, top, first)
        gap += np.where(solid, np.maximum(0, low - start), 0)
        top = np.where(solid, c["high"] * e.page_bytes, top)
        seen |= solid
    if ext0[-1].kind is not DOWN:
        gap += np.where(seen, np.maximum(0, total_bytes - top), 0)
    return gap


# -- float relocation plans (pure: the float band applies them) --

class Relocation(NamedTuple):
    """A float's planned layout: live pages `srcs` move to `dsts` (in
    pairs), then the span is `[low, high)` with the free pages `holes`."""

    srcs: tuple[int, ...]
    dsts: tuple[int, ...]
    low: int
    high: int
    holes: tuple[int, ...]


def relocated(e: Extent, plan: Relocation) -> Extent:
    """Float extent `e` once `plan` is applied (live pages are kept)."""
    return Extent(e.kind, e.page_bytes, e.min_page, e.num_pages, plan.low, plan.high,
                  len(plan.holes), e.live, e.cap)


def absorb_plan(low: int, high: int, holes) -> Relocation:
    """The span `[low, high)` shrunk past the holes on both its boundaries
    (`holes`: distinct pages inside the span, any order; a list or an
    array). Sorted once in numpy: the leading run is the holes equal to
    `low, low + 1, ...`, the trailing run those equal to `high - 1, ...`."""
    s = np.sort(np.asarray(holes, dtype=np.int64))
    n = len(s)
    lead = _run_length(s - np.arange(low, low + n))
    rest = s[lead:]
    m = len(rest)
    tail = _run_length(rest[::-1] - np.arange(high - 1, high - 1 - m, -1))
    return Relocation((), (), low + lead, high - tail, tuple(rest[: m - tail].tolist()))


def _run_length(diff: np.ndarray) -> int:
    """How many leading entries of `diff` are 0."""
    off = np.flatnonzero(diff)
    return int(off[0]) if len(off) else len(diff)


def room_plan(low: int, high: int, holes: Sequence[int], region: tuple[int, int], side: Side,
              need_pages: int, keep_far_pages: int = 0) -> Relocation | None:
    """Open `need_pages` free pages between the span's `side` boundary and
    the region's edge there, displacing the span as little as possible.

    The strip of the span nearest `side` is vacated: its holes are dropped
    and its live pages move into the holes beyond it, then into the far
    gap (no closer than `keep_far_pages` to the region's far edge, so the
    far neighbour keeps that room). When that would move every live page,
    or the far side cannot take them, the whole span is packed just far
    enough from `side` (a leapfrog). None when the region's free pages are
    fewer than `need_pages`.
    """
    lo, hi = region
    free = set(holes)
    n_live = high - low - len(free)
    if hi - lo - n_live < need_pages:
        return None
    strip = need_pages - (low - lo if side is Side.LOW else hi - high)
    if strip <= 0:
        return Relocation((), (), low, high, tuple(sorted(free)))
    plan = _strip_plan(low, high, free, n_live, (lo, hi), side, strip, keep_far_pages)
    if plan is not None:
        return plan
    live = [p for p in range(low, high) if p not in free]  # a leapfrog moves them all
    start = lo + need_pages if side is Side.LOW else hi - need_pages - len(live)
    return Relocation(tuple(live), tuple(range(start, start + len(live))), start, start + len(live), ())


def _strip_plan(low, high, free, n_live, region, side, strip, keep_far):
    """Vacate `strip` pages at `side` into far holes, then the far gap.
    Linear in the strip and the holes, never in the span or the gap."""
    lo, hi = region
    if strip >= high - low:
        return None
    if side is Side.HIGH:
        cut = high - strip
        srcs = [p for p in range(high - 1, cut - 1, -1) if p not in free]  # boundary first
        far_holes = sorted(h for h in free if h < cut)  # deepest first
        fresh = range(low - 1, lo + keep_far - 1, -1)
    else:
        cut = low + strip
        srcs = [p for p in range(low, cut) if p not in free]
        far_holes = sorted((h for h in free if h >= cut), reverse=True)
        fresh = range(high, hi - keep_far)
    if len(srcs) >= n_live:
        return None
    dsts = (far_holes + list(fresh[: max(0, len(srcs) - len(far_holes))]))[: len(srcs)]
    if len(dsts) < len(srcs):
        return None
    kept = set(far_holes) - set(dsts)
    if side is Side.HIGH:
        new_low, new_high = min([low, *dsts]), cut
    else:
        new_low, new_high = cut, max([high - 1, *dsts]) + 1
    return Relocation(tuple(srcs), tuple(dsts), new_low, new_high, tuple(sorted(kept)))


def room_extent(low: int, high: int, holes: Sequence[int], region: tuple[int, int], side: Side,
                need_pages: int, keep_far_pages: int = 0) -> tuple[int, int, int] | None:
    """`(low, high, holes)` of the span `room_plan` would plan, or None when
    it plans nothing, from the holes sorted ascending: counts by bisection,
    no plan built. The capacity search asks this for many sizes; the ladder
    then builds the one plan it applies with `room_plan` (a test holds the
    two equal)."""
    lo, hi = region
    n_live = high - low - len(holes)
    if hi - lo - n_live < need_pages:
        return None
    strip = need_pages - (low - lo if side is Side.LOW else hi - high)
    if strip <= 0:
        return low, high, len(holes)
    if strip < high - low:
        if side is Side.HIGH:
            cut = high - strip
            far = bisect.bisect_left(holes, cut)  # holes below the cut (all >= low)
            srcs = strip - (len(holes) - far)
            fresh = max(0, low - lo - keep_far_pages)
        else:
            cut = low + strip
            far = len(holes) - bisect.bisect_left(holes, cut)
            srcs = strip - (len(holes) - far)
            fresh = max(0, hi - keep_far_pages - high)
        if srcs < n_live and srcs <= far + fresh:
            spill = max(0, srcs - far)  # fresh pages taken beyond the span
            if side is Side.HIGH:
                return low - spill, cut, far - min(srcs, far)
            return cut, high + spill, far - min(srcs, far)
    start = lo + need_pages if side is Side.LOW else hi - need_pages - n_live  # the leapfrog
    return start, start + n_live, 0
