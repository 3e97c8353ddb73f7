"""Bands of the baselines: a fixed private region, or a pure byte budget."""

from __future__ import annotations

from typing import Optional

import torch

from unikv.bands.base import BandAllocator
from unikv.extent import Extent, Kind, take
from unikv.hazards import Tracked


class RegionBand(BandAllocator):
    """A band confined to a fixed page range `[region_low, region_high)`.

    This is the static split serving engines use today: a free page is
    reused in place, nothing ever moves, and a region's unused pages are
    stranded for every other band.
    """

    kind = Kind.REGION
    fill = Tracked()  # pages below `fill` have been handed out at least once
    live = Tracked()
    holes = Tracked()

    def reset(self) -> None:
        self.region_low, self.region_high = self.ctx.regions[self.name]
        self.fill = self.region_low
        self.live = 0
        self.holes = self.backend.arange(0, 0)

    def extent(self) -> Extent:
        g = self.geom
        return Extent(Kind.REGION, g.page_bytes, g.min_page, g.num_pages, self.region_low,
                      self.fill, int(self.holes.numel()), self.live, cap=self.region_high)

    def apply_extent(self, new: Extent) -> None:
        self.fill, self.live = new.high, new.live

    def release(self, p_pages: torch.Tensor) -> int:
        self.live = self.live - int(p_pages.numel())
        if self.live == 0:  # nothing live: the region is empty again
            self.fill, self.holes = self.region_low, self.backend.arange(0, 0)
        else:
            self.holes = torch.cat([self.holes, p_pages])
        return 0

    def violations(self) -> list[str]:
        out = []
        if self.fill - self.region_low != self.live + int(self.holes.numel()):
            out.append(f"[{self.name}] filled {self.fill - self.region_low} != live "
                       f"{self.live} + holes {int(self.holes.numel())}")
        return out + self.table_violations(self.live)


class BudgetBand(BandAllocator):
    """A band with no byte geometry: its pages draw on one shared budget.

    The oracle: every free byte is usable by any band at any time. Physical
    page ids are bookkeeping only (bands' ids may alias the same bytes).
    """

    kind = Kind.BUDGET
    live = Tracked()
    free_ids = Tracked()

    def reset(self) -> None:
        self.live = 0
        self.free_ids = self.backend.arange(self.geom.min_page, self.geom.num_pages)

    def extent(self) -> Extent:
        g = self.geom
        budget = self.ctx.chain.total_bytes - self.ctx.chain.sink_bytes
        return Extent(Kind.BUDGET, g.page_bytes, g.min_page, g.num_pages, 0, 0, 0,
                      self.live, cap=budget)

    def take(self, n: int) -> Optional[torch.Tensor]:
        if take(self.chain_extents(), self.index, n, self.total_bytes) is None:
            return None
        pages, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        self.live = self.live + n
        return pages

    def release(self, p_pages: torch.Tensor) -> int:
        self.free_ids = torch.cat([self.free_ids, p_pages])
        self.live = self.live - int(p_pages.numel())
        return 0

    def violations(self) -> list[str]:
        return self.table_violations(self.live)
