"""The FLOAT band: a movable span between two neighbours, holes first.

Frees only mark holes (no copy) and allocs reuse holes before extending, so
steady churn (the sliding-window ratchet) costs no data movement. Pages move
only on demand: `make_room` opens contiguous space on one side for a
neighbour, `compact_holes` closes every hole. An empty float is transparent:
it occupies no bytes and its neighbours see straight through it.
"""

from __future__ import annotations

import numpy as np

from unikv.bands.base import EMPTY, BandAllocator
from unikv.extent import Extent, Kind, float_gaps, float_region
from unikv.hazards import Tracked
from unikv.layout import Side


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
        # Frees since the last absorb: only a free can put a hole on a
        # boundary, so a clean flag lets the absorb skip its host read.
        self.dirty = False

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

    def release(self, p_pages: np.ndarray) -> int:
        if len(p_pages) == 0:
            return 0
        self.holes = np.concatenate([self.holes, p_pages])
        self.dirty = True
        self._park_if_empty()
        return 0

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
        if self._park_if_empty() or not self.dirty:
            return 0
        self.dirty = False
        h = self.holes
        if not ((h == self.low).any() or (h == self.high - 1).any()):
            return 0  # no boundary hole: nothing to absorb (one vector scan)
        holes = set(h.tolist())
        low, high = self.low, self.high
        while low in holes:
            holes.discard(low)
            low += 1
        while high - 1 in holes:
            holes.discard(high - 1)
            high -= 1
        freed = (self.high - self.low) - (high - low)
        if freed:
            self.low, self.high = low, high
            self.holes = np.asarray(sorted(holes), dtype=np.int64)
            self.counters.absorbed_pages += freed
        return freed

    # -- on-demand relocation --

    def gap_bytes(self, side: Side) -> int:
        gap_low, gap_high = float_gaps(self.chain_extents(), self.index, self.total_bytes)
        return (gap_low if side is Side.LOW else gap_high) * self.page_bytes

    def make_room(self, side: Side, min_bytes: int) -> int:
        """Open >= `min_bytes` of contiguous free bytes on `side` of the span.

        Moves the fewest boundary pages on `side` into holes on the far side,
        then into the far gap; when that would move every live page, packs
        the whole span against the far edge instead (a leapfrog). Settles the
        in-flight forward before the first copy. Returns the bytes now open
        on `side` (< `min_bytes` only when impossible; the state is then
        unchanged).
        """
        self.absorb()
        open_now = self.gap_bytes(side)
        if open_now >= min_bytes or self.live == 0:
            return open_now
        lo, hi = float_region(self.chain_extents(), self.index, self.total_bytes)
        if (hi - lo - self.live) * self.page_bytes < min_bytes:
            return open_now
        need = -(-(min_bytes - open_now) // self.page_bytes)
        holes = set(self.holes.tolist())
        plan = self._boundary_plan(side, need, holes, self.live, lo, hi)
        if plan is None:
            live = [p for p in range(self.low, self.high) if p not in holes]
            packed = range(lo, lo + len(live)) if side is Side.HIGH else range(hi - len(live), hi)
            self._relocate(live, list(packed))
        else:
            self._relocate(*plan)
        return self.gap_bytes(side)

    def _boundary_plan(self, side, need, holes, live: int, lo, hi):
        """(srcs, dsts) that vacate `need` pages at `side`, or None when the
        far holes and far gap cannot take them (then leapfrog)."""
        walk = range(self.high - 1, self.low - 1, -1) if side is Side.HIGH else range(self.low, self.high)
        srcs: list[int] = []
        edge = self.low if side is Side.HIGH else self.high
        for opened, p in enumerate(walk, start=1):
            edge = p
            if p not in holes:
                srcs.append(p)
            if opened >= need:
                break
        if len(srcs) >= live:
            return None
        # Destinations lie strictly beyond the vacated strip.
        if side is Side.HIGH:
            far_holes = sorted(h for h in holes if h < edge)
            fresh = range(self.low - 1, lo - 1, -1)
        else:
            far_holes = sorted((h for h in holes if h > edge), reverse=True)
            fresh = range(self.high, hi)
        dsts = (far_holes + list(fresh[: max(0, len(srcs) - len(far_holes))]))[: len(srcs)]
        if len(dsts) < len(srcs):
            return None
        return srcs, dsts

    def compact_holes(self, retreat_side: Side) -> int:
        """Close every hole, packing live pages away from `retreat_side`
        (order kept); returns page moves."""
        self.absorb()
        if len(self.holes) == 0:
            return 0
        holes = set(self.holes.tolist())
        live = [p for p in range(self.low, self.high) if p not in holes]
        if retreat_side is Side.HIGH:
            packed = range(self.low, self.low + len(live))
        else:
            packed = range(self.high - len(live), self.high)
        return self._relocate(live, list(packed))

    def _relocate(self, srcs: list[int], dsts: list[int]) -> int:
        """Move live `srcs` to `dsts` and rebuild the span around the result,
        in time linear in the moves and holes (not in the span)."""
        pairs = [(s, d) for s, d in zip(srcs, dsts) if s != d]
        live = self.live
        if pairs:
            self.ctx.hazards.settle()
            self.move([s for s, _ in pairs], [d for _, d in pairs])
            self.counters.relocations += 1
        to = {d for _, d in pairs}
        free = (set(self.holes.tolist()) | {s for s, _ in pairs}) - to
        low, high = self.low, self.high
        while low < high and low in free:  # trim the old span's freed edges
            low += 1
        while high > low and high - 1 in free:
            high -= 1
        outside = [d for d in to if not self.low <= d < self.high]
        if outside:
            lo_out, hi_out = min(outside), max(outside) + 1
            low, high = (lo_out, hi_out) if low == high else (min(low, lo_out), max(high, hi_out))
        holes = {p for p in free if low <= p < high}
        if high - low - len(holes) != live:  # free gap pages inside the new span (rare)
            old, dest = range(self.low, self.high), set(outside)
            holes |= {p for p in range(low, high) if p not in old and p not in dest}
        self.low, self.high = low, high
        self.holes = np.asarray(sorted(holes), dtype=np.int64)
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
