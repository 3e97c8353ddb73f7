"""END bands: grow from one buffer end, compacted eagerly or lazily.

Live pages sit between the buffer end and the watermark. Eager compaction
keeps that range dense at every free; lazy compaction lets frees leave holes
(reused first by allocs) and packs the band at flush time.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from unikv.bands.base import EMPTY, BandAllocator
from unikv.extent import Extent, Kind
from unikv.hazards import Tracked
from unikv.layout import Grow


class EndBand(BandAllocator):
    """An END band (grow up or down) over its own page grid.

    Occupied range: `[min_page, watermark)` growing up,
    `[watermark, num_pages)` growing down.
    """

    watermark = Tracked()
    live = Tracked()
    holes = Tracked()  # int64 host array of free physical pages inside the range

    def reset(self) -> None:
        self.kind = Kind.UP if self.geom.band.grow is Grow.UP else Kind.DOWN
        self.up = self.kind is Kind.UP
        self.live = 0
        self._reset_frontier()
        # Pages a move vacated while the forward still read them:
        # [(event, page list)], oldest first.
        self.pending: list[tuple[object, list[int]]] = []
        self.pending_set: set[int] = set()
        # The hole array the last absorb left, its pages ascending and as a
        # set: while `holes` is still that array, it is sorted and touches no
        # frontier (allocs drain holes by rebinding the array and extend with
        # live pages), so a flush needs no second sort and absorb.
        self._absorbed: tuple[np.ndarray, list[int], set[int]] = (EMPTY, [], set())

    def _reset_frontier(self) -> None:
        self.watermark = self.geom.min_page if self.up else self.geom.num_pages
        self.holes = EMPTY

    @property
    def lazy(self) -> bool:
        return self.ctx.lazy

    def span(self) -> tuple[int, int]:
        if self.up:
            return self.geom.min_page, self.watermark
        return self.watermark, self.geom.num_pages

    def extent(self) -> Extent:
        low, high = self.span()
        g = self.geom
        return Extent(self.kind, g.page_bytes, g.min_page, g.num_pages, low, high,
                      len(self.holes), self.live)

    def pending_pages(self) -> int:
        return len(self.pending_set)

    # -- take / release --

    def apply_extent(self, new: Extent) -> None:
        self.watermark = new.high if self.up else new.low
        self.live = new.live

    def release(self, p_pages: np.ndarray) -> int:
        n = len(p_pages)
        if n == 0:
            return 0
        if self.lazy:
            self.live = self.live - n
            if self.live == 0 and not self.pending:
                self._reset_frontier()  # nothing live: the whole range is free
            else:
                self.holes = np.concatenate([self.holes, p_pages])
            return 0
        return self._compact_now(p_pages.tolist())

    def _compact_now(self, freed: list[int]) -> int:
        """Eager: retreat the watermark by the freed count and move the
        survivors of the vacated strip into the freed pages left behind."""
        low, high = self.span()
        k = len(freed)
        freed_set = set(freed)
        strip = range(high - k, high) if self.up else range(low, low + k)
        srcs = [p for p in strip if p not in freed_set]
        dsts = sorted(p for p in freed_set if p not in strip)
        if srcs:
            self.ctx.hazards.settle()
            self.move(srcs, dsts)
        self.watermark = high - k if self.up else low + k
        self.live = self.live - k
        return len(srcs)

    # -- lazy flush --

    def flush(self, urgent: bool) -> int:
        """Absorb frontier holes and move top survivors into the deepest holes.

        Non-urgent: at most `move_cap` moves, stopping at a page the running
        forward writes; vacated pages the forward may still read wait in
        pending-reuse. Urgent: settle the forward first, then pack fully.
        """
        if not self.lazy:
            return 0
        self.counters.flushes += 1
        self.counters.urgent_flushes += int(urgent)
        if not self.pending and len(self.holes) == 0:
            return 0  # nothing freed since the last flush
        self._drain_pending(urgent)
        holes = self._absorbed_holes()
        if not holes:
            return 0
        if urgent:
            self.ctx.hazards.settle()
            srcs, dsts = self._plan_pack(cap=None, blocked=set())
        else:
            blocked = self.ctx.hazards.written_pages(self.name, self.v2p)
            srcs, dsts = self._plan_pack(cap=self.ctx.move_cap, blocked=blocked)
        if not srcs:
            return 0  # nothing moved: the hole list stays as absorbed
        self.move(srcs, dsts)
        moved_to = set(dsts)
        left = [h for h in holes if h not in moved_to]
        reader = None if urgent else self.ctx.hazards.pending_event()
        if reader is not None:
            self.pending.append((reader, srcs))
            self.pending_set.update(srcs)
            self.counters.pending_peak = max(self.counters.pending_peak, len(self.pending_set))
        else:
            left += srcs
        self._absorb(sorted(left))
        return len(srcs)

    def _drain_pending(self, urgent: bool) -> None:
        """Return vacated pages whose reader finished to the hole list."""
        keep, ready = [], []
        for event, pages in self.pending:
            if urgent and not self.backend.event_done(event):
                self.backend.wait_event(event)
            if self.backend.event_done(event):
                ready += pages
                self.pending_set.difference_update(pages)
            else:
                keep.append((event, pages))
        self.pending = keep
        if ready:
            self.holes = np.concatenate([self.holes, np.asarray(ready, dtype=np.int64)])

    def _absorbed_holes(self) -> list[int]:
        """The holes ascending, frontier holes absorbed first (skipped while
        the hole list is the one the last absorb left)."""
        array, ascending, _ = self._absorbed
        if array is self.holes:
            return ascending
        return self._absorb(sorted(self.holes.tolist()))

    def _absorb(self, holes: list[int]) -> list[int]:
        """Retreat the watermark past holes touching it; keep the rest as the
        hole list (deepest first) and return them ascending.

        `holes` are distinct and ascending. The hole array is rebuilt only
        when its pages or their order change (an alloc drains from the deep
        end, which keeps it in order).
        """
        hole_set = set(holes)
        wm = self.watermark
        if self.up:
            while wm - 1 in hole_set:
                wm -= 1
                hole_set.discard(wm)
        else:
            while wm in hole_set:
                hole_set.discard(wm)
                wm += 1
        absorbed = abs(wm - self.watermark)
        if absorbed:  # the absorbed pages are the frontier end of `holes`
            self.counters.absorbed_pages += absorbed
            self.watermark = wm
            holes = holes[:len(holes) - absorbed] if self.up else holes[absorbed:]
        stored = holes if self.up else holes[::-1]
        if absorbed or self.holes.tolist() != stored:
            self.holes = np.asarray(stored, dtype=np.int64)
        self._absorbed = (self.holes, holes, hole_set)
        return holes

    def _plan_pack(self, cap: Optional[int], blocked: set[int]):
        """Pair the outermost survivors with the deepest holes (those the
        last absorb left) until the two walks cross (the band is then dense
        below its frontier)."""
        _, holes, hole_set = self._absorbed
        skip = hole_set | self.pending_set if self.pending_set else hole_set
        deep = iter(holes) if self.up else reversed(holes)
        low, high = self.span()
        outer = range(high - 1, low - 1, -1) if self.up else range(low, high)
        survivors = (p for p in outer if p not in skip)
        srcs: list[int] = []
        dsts: list[int] = []
        for dst in deep:
            src = next(survivors, None)
            if src is None or (src < dst if self.up else src > dst):
                break
            if src in blocked or (cap is not None and len(srcs) >= cap):
                break
            srcs.append(src)
            dsts.append(dst)
        return srcs, dsts

    def violations(self) -> list[str]:
        out: list[str] = []
        low, high = self.span()
        holes = self.holes.tolist()
        span = high - low
        if span != self.live + len(holes) + len(self.pending_set):
            out.append(
                f"[{self.name}] span {span} != live {self.live} + holes {len(holes)} "
                f"+ pending {len(self.pending_set)}"
            )
        free = set(holes) | self.pending_set
        if len(free) != len(holes) + len(self.pending_set):
            out.append(f"[{self.name}] a page is listed twice among holes / pending")
        if any(not low <= p < high for p in free):
            out.append(f"[{self.name}] a hole or pending page lies outside [{low}, {high})")
        if free and bool((self.p2v[sorted(free)] >= 0).any()):
            out.append(f"[{self.name}] a hole or pending page is still bound in p2v")
        return out + self.table_violations(self.live)
