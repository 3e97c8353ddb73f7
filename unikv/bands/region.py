"""Bands of the baselines: a fixed private region, or a pure byte budget."""

from __future__ import annotations

import numpy as np

from unikv.bands.base import EMPTY, BandAllocator
from unikv.extent import BUDGET, REGION, Extent, Kind, new_extent
from unikv.hazards import Tracked


class RegionBand(BandAllocator):
    """A band confined to a fixed page range `[region_low, region_high)`.

    This is the static split serving engines use today: a free page is
    reused in place, nothing ever moves, and a region's unused pages are
    stranded for every other band.
    """

    kind = Kind.REGION
    fill: Tracked[int] = Tracked()  # pages below `fill` have been handed out at least once
    live: Tracked[int] = Tracked()
    holes: Tracked[np.ndarray] = Tracked()

    def reset(self) -> None:
        regions = self.ctx.regions
        if regions is None:
            raise ValueError(f"RegionBand {self.name!r}: BandContext.regions is None; "
                             "a static split needs each band's (low, high) pages")
        self.region_low, self.region_high = regions[self.name]
        self.fill = self.region_low
        self.live = 0
        self.holes = EMPTY

    def extent(self) -> Extent:
        g = self.geom
        return new_extent(Extent, (REGION, g.page_bytes, g.min_page, g.num_pages, self.region_low,
                                   self.fill, len(self.holes), self.live, self.region_high))

    def apply_extent(self, new: Extent) -> None:
        self.fill, self.live = new.high, new.live

    def release(self, p_pages: np.ndarray) -> int:
        self.live = self.live - len(p_pages)
        if self.live == 0:  # nothing live: the region is empty again
            self.fill, self.holes = self.region_low, EMPTY
        else:
            self.holes = np.concatenate([self.holes, p_pages])
        return 0

    def violations(self) -> list[str]:
        out = []
        if self.fill - self.region_low != self.live + len(self.holes):
            out.append(f"[{self.name}] filled {self.fill - self.region_low} != live "
                       f"{self.live} + holes {len(self.holes)}")
        return out + self.table_violations(self.live)


class BudgetBand(BandAllocator):
    """A band with no byte geometry: its pages draw on one shared budget.

    The oracle: every free byte is usable by any band at any time. Physical
    page ids are bookkeeping only (bands' ids may alias the same bytes).
    """

    kind = Kind.BUDGET
    live: Tracked[int] = Tracked()

    def reset(self) -> None:
        self.live = 0
        self._budget_bytes = self.ctx.total_bytes - self.ctx.sink_bytes  # shared by every band
        # Free page ids as a stack (next-to-take last): O(k) per call.
        g = self.geom
        self._stack = np.arange(g.num_pages - 1, g.min_page - 1, -1, dtype=np.int64)
        self._top = len(self._stack)

    def extent(self) -> Extent:
        g = self.geom
        return new_extent(Extent, (BUDGET, g.page_bytes, g.min_page, g.num_pages, 0, 0, 0,
                                   self.live, self._budget_bytes))

    def adopt(self, old: Extent, new: Extent) -> np.ndarray:
        n = new.live - old.live
        pages = self._stack[self._top - n:self._top][::-1].copy()
        self._top -= n
        self.live = self.live + n
        return pages

    def release(self, p_pages: np.ndarray) -> int:
        k = len(p_pages)
        self._stack[self._top:self._top + k] = p_pages
        self._top += k
        self.live = self.live - k
        return 0

    def violations(self) -> list[str]:
        return self.table_violations(self.live)
