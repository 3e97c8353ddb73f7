"""The FLOAT band: a movable span between two neighbours, holes first.

Frees only mark holes (no copy) and allocs reuse holes before extending, so
steady churn (the sliding-window ratchet) costs no data movement. Pages move
only on demand: `make_room` opens contiguous space on one side for a
neighbour, `compact_holes` closes every hole. Both are planned first as pure
`extent.Relocation`s, so the policy can check a plan before anything moves.
An empty float is transparent: it occupies no bytes and its neighbours see
straight through it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unikv.bands.base import EMPTY, BandAllocator
from unikv.extent import Extent, Kind, Relocation, absorb_plan, float_gaps, float_region, room_plan
from unikv.hazards import Tracked
from unikv.layout import Side

FIRST_STORE = 1024  # entries of the smallest hole store (`FloatBand._appended`)


class FloatBand(BandAllocator):
    """Span `[low, high)` of pages with interior holes."""

    kind = Kind.FLOAT
    low = Tracked()
    high = Tracked()
    holes = Tracked()

    def reset(self) -> None:
        self.low = 0
        self.high = 0
        self.holes = EMPTY
        # Frees append to the hole list and allocs take from its front, so
        # the list is kept as the tail slice of a larger array, `_store`,
        # ending at `_end`: while `holes` is a slice of the store it ends
        # there (`_appended`). A fresh array: no hole list is a slice of it.
        self._store = np.zeros(0, dtype=np.int64)
        self._end = 0
        # Frees since the last absorb: only a free can put a hole on a
        # boundary, so a clean flag lets the absorb skip its host read.
        self.dirty = False
        # (holes array, span, plan) of the last plan_absorb
        self._absorb_memo: tuple[np.ndarray, tuple[int, int], Relocation | None] | None = None

    @property
    def live(self) -> int:
        return self.high - self.low - len(self.holes)

    def extent(self) -> Extent:
        g = self.geom
        return Extent(Kind.FLOAT, g.page_bytes, g.min_page, g.num_pages, self.low, self.high,
                      len(self.holes), self.live)

    # -- take / release --

    def apply_extent(self, new: Extent) -> None:
        self.low, self.high = new.low, new.high

    def gain_live(self, n: int) -> None:
        pass  # live is the span less the holes

    def release(self, p_pages: np.ndarray) -> int:
        if len(p_pages) == 0:
            return 0
        self.holes = self._appended(p_pages)
        self.dirty = True
        self._park_if_empty()
        return 0

    def _appended(self, pages: np.ndarray) -> np.ndarray:
        """The hole list followed by `pages`, written past its end in the
        store (no copy of the list, unlike a concatenation: the float's
        list holds thousands of holes under a sliding window). A list that
        is not a slice of the store (set by `relocate` or `reset`), or a
        full store, moves to a new store with room for as many again."""
        h, store, end, k = self.holes, self._store, self._end, len(pages)
        if h.base is not store or end + k > len(store):
            n = len(h)
            store = self._store = np.empty(max(2 * (n + k), FIRST_STORE), dtype=np.int64)
            store[:n] = h
            end = n
        store[end:end + k] = pages
        self._end = end + k
        return store[end - len(h):end + k]

    def _park_if_empty(self) -> bool:
        if self.live != 0:
            return False
        self.reset()
        return True

    def flush(self, urgent: bool) -> int:
        """Boundary absorption only (zero copies); returns 0 page moves."""
        self.counters.flushes += 1
        self.counters.urgent_flushes += int(urgent)
        self.absorb()
        return 0

    def absorb(self) -> int:
        """Shrink the span past holes on its boundaries; returns pages freed."""
        plan = self.plan_absorb()
        if plan is None:
            self.dirty = False
            return 0
        freed = (self.high - self.low) - (plan.high - plan.low)
        self.relocate(plan)
        self.dirty = False
        self.counters.absorbed_pages += freed
        return freed

    def plan_absorb(self) -> Relocation | None:
        """The span an absorb would leave (nothing changes), or None when
        it would free nothing."""
        if self.absorb_span() is None:
            return None
        h = self.holes
        memo = self._absorb_memo
        if memo is not None and memo[0] is h and memo[1] == (self.low, self.high):
            return memo[2]  # asked again before anything changed
        plan = absorb_plan(self.low, self.high, h)
        self._absorb_memo = (h, (self.low, self.high), plan)
        return plan

    def absorb_span(self) -> tuple[int, int, int] | None:
        """`(low, high, holes)` of the span `plan_absorb` would leave, or
        None when it would free nothing, without building the plan (its
        remaining holes, sorted: the policy refuses most absorbs, and only
        an applied one needs them). An empty float parks first, as there.

        A page of the span is a hole exactly when no virtual page binds it
        (the span holds live pages and holes only: `violations`), so the
        two boundary pages are read from p2v, and when either is a hole,
        the span's first or last bound page from one vector read of the
        span (the runs of holes are often hundreds of pages long; a span
        is a few hundred to a few thousand).
        """
        if self._park_if_empty() or not self.dirty:
            return None
        p2v, low, high = self.p2v, self.low, self.high
        low_hole, high_hole = p2v[low] < 0, p2v[high - 1] < 0
        if not (low_hole or high_hole):
            return None
        bound = p2v[low:high] >= 0  # some page is: the float is not parked
        lo = low + int(bound.argmax()) if low_hole else low
        hi = high - int(bound[::-1].argmax()) if high_hole else high
        return lo, hi, len(self.holes) - (lo - low) - (high - hi)

    # -- on-demand relocation --

    def gap_bytes(self, side: Side, chain: Sequence[Extent]) -> int:
        """Free bytes between the span's `side` boundary and the neighbour
        there (`chain`: every band's extent, this one's as now)."""
        gap_low, gap_high = float_gaps(chain, self.index, self.total_bytes)
        return (gap_low if side is Side.LOW else gap_high) * self.page_bytes

    def make_room(self, side: Side, min_bytes: int, chain: Sequence[Extent],
                  keep_far_bytes: int = 0) -> int:
        """Open >= `min_bytes` of contiguous free bytes on `side` of the span.

        Applies `plan_room` (fewest boundary pages moved, the span displaced
        no further than needed) on `chain`, every band's extent now.
        Settles the in-flight forward before the first copy. Returns the
        bytes now open on `side` (< `min_bytes` only when impossible; the
        state is then unchanged).
        """
        plan = self.plan_room(side, min_bytes, chain, keep_far_bytes)
        if plan is None:
            return self.gap_bytes(side, chain)
        self.relocate(plan)
        after = list(chain)
        after[self.index] = self.extent()  # only this band moved
        return self.gap_bytes(side, after)

    def plan_room(self, side: Side, min_bytes: int, chain: Sequence[Extent],
                  keep_far_bytes: int = 0) -> Relocation | None:
        """Where `make_room` would put the span on `chain` (every band's
        extent; nothing changes): see `extent.room_plan`; `keep_far_bytes`
        of the far gap stay free when the boundary pages can go elsewhere.
        None when the free pages between the neighbours are too few, or the
        float is empty."""
        if self.live == 0:
            return None
        pages = lambda b: -(-b // self.page_bytes)  # noqa: E731
        region = float_region(chain, self.index, self.total_bytes)
        return room_plan(self.low, self.high, self.holes.tolist(), region, side,
                         pages(min_bytes), pages(keep_far_bytes))

    def compact_holes(self, retreat_side: Side) -> int:
        """Close every hole, packing live pages away from `retreat_side`
        (order kept); returns page moves."""
        self.absorb()
        if len(self.holes) == 0:
            return 0
        holes = set(self.holes.tolist())
        live = [p for p in range(self.low, self.high) if p not in holes]
        start = self.low if retreat_side is Side.HIGH else self.high - len(live)
        packed = tuple(range(start, start + len(live)))
        return self.relocate(Relocation(tuple(live), packed, start, start + len(live), ()))

    def relocate(self, plan: Relocation) -> int:
        """Apply a plan: move its live pages, then take its span and holes;
        returns page moves."""
        pairs = [(s, d) for s, d in zip(plan.srcs, plan.dsts) if s != d]
        if pairs:
            self.ctx.hazards.settle()
            self.move([s for s, _ in pairs], [d for _, d in pairs])
            self.counters.relocations += 1
        self.low, self.high = plan.low, plan.high
        self.holes = np.array(plan.holes, dtype=np.int64)  # a copy: never a slice of the store
        self.dirty = bool(plan.holes)  # a plan may leave holes on a boundary
        return len(pairs)

    def violations(self) -> list[str]:
        out: list[str] = []
        holes = self.holes.tolist()
        if len(set(holes)) != len(holes):
            out.append(f"[{self.name}] a hole is listed twice")
        if any(not self.low <= h < self.high for h in holes):
            out.append(f"[{self.name}] a hole lies outside the span [{self.low}, {self.high})")
        if holes and bool((self.p2v[holes] >= 0).any()):
            out.append(f"[{self.name}] a hole is still bound in p2v")
        if self.live < 0:
            out.append(f"[{self.name}] span {self.high - self.low} < holes {len(holes)}")
        return out + self.table_violations(self.live)
