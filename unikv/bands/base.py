"""What every band allocator shares: geometry, page tables, moves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from unikv.extent import Extent, Kind, take
from unikv.hazards import Epoch, Hazards
from unikv.layout import BandGeometry
from unikv.stats import BandCounters

if TYPE_CHECKING:
    from unikv.chain import Chain


@dataclass
class BandContext:
    """What a band receives from the pool that builds it."""

    backend: object
    buffer: Optional[torch.Tensor]
    epoch: Epoch
    hazards: Hazards
    chain: "Chain"
    vspace: int  # size of the virtual page id space this band's v2p covers
    lazy: bool  # END bands: lazy (True) or eager (False) compaction
    move_cap: int  # most survivor moves one non-urgent flush makes
    regions: Optional[dict] = None  # static split: band name -> (low, high) pages


class BandAllocator:
    """One band's mechanism: its page tables and its occupied range.

    Subclasses define how pages are taken and returned (`take`, `release`),
    what a flush does, and their own conservation checks. Page tables:
    `v2p[v]` is the physical page of virtual page `v` (-1 unbound) and
    `p2v[p]` its inverse; entry 0 of both is the sink.
    """

    kind: Kind

    def __init__(self, geom: BandGeometry, ctx: BandContext, counters: BandCounters) -> None:
        self.geom = geom
        self.name = geom.band.name
        self.page_bytes = geom.page_bytes
        self.ctx = ctx
        self.backend = ctx.backend
        self.epoch = ctx.epoch
        self.counters = counters
        self.v2p = self.backend.table(ctx.vspace)
        self.p2v = self.backend.table(geom.num_pages)
        self.v2p[0] = 0
        self.p2v[0] = 0
        self.reset()

    # -- state every subclass defines --

    def reset(self) -> None:
        """Return to the empty state (tables are reset by `clear`)."""
        raise NotImplementedError

    def extent(self) -> Extent:
        raise NotImplementedError

    def take(self, n: int) -> Optional[torch.Tensor]:
        """Physical pages for `n` new live pages, or None (state unchanged):
        the holes the chain arithmetic drains, then the fresh frontier pages."""
        chain = self.chain_extents()
        old = chain[self.index]
        new = take(chain, self.index, n, self.total_bytes)
        if new is None:
            return None
        drain = old.holes - new.holes
        drained, self.holes = self.holes[:drain], self.holes[drain:]
        self.apply_extent(new)
        if new.live - old.live == drain:
            return drained
        return torch.cat([drained, self.fresh_pages(old, new)])

    def apply_extent(self, new: Extent) -> None:
        """Adopt the frontier and live count of `new` after a take."""
        raise NotImplementedError

    def release(self, p_pages: torch.Tensor) -> int:
        """Return pages already unbound from the tables; returns page moves."""
        raise NotImplementedError

    def flush(self, urgent: bool) -> int:
        """Reclaim what frees lazily; returns page moves."""
        return 0

    def pending_pages(self) -> int:
        return 0

    def violations(self) -> list[str]:
        return []

    # -- shared --

    def clear(self) -> None:
        self.v2p.fill_(-1)
        self.p2v.fill_(-1)
        self.v2p[0] = 0
        self.p2v[0] = 0
        self.reset()

    @property
    def index(self) -> int:
        return self.geom.index

    @property
    def total_bytes(self) -> int:
        return self.ctx.chain.total_bytes

    def chain_extents(self) -> list[Extent]:
        return self.ctx.chain.extents()

    def bind(self, v_pages: torch.Tensor, p_pages: torch.Tensor) -> None:
        self.backend.bind(v_pages, p_pages, self.v2p, self.p2v)
        self.counters.allocated_pages += int(v_pages.numel())

    def unbind(self, v_pages: torch.Tensor) -> torch.Tensor:
        """Tombstone `v_pages` (all bound here); return their physical pages."""
        self.counters.freed_pages += int(v_pages.numel())
        return self.backend.free_unbind(v_pages, self.v2p, self.p2v)

    def move(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy live pages `src -> dst` and rebind their virtual pages.

        `src` and `dst` may overlap as an ordered shift (see the backend's
        `move_pages` contract).
        """
        if not src:
            return
        s, d = self.backend.ids(list(src)), self.backend.ids(list(dst))
        disjoint = set(src).isdisjoint(dst)  # known on the host: spares the backend a read
        self.backend.move_pages(self.ctx.buffer, self.page_bytes, s, d, disjoint=disjoint)
        self.backend.remap_moved(s, d, self.v2p, self.p2v)
        self.counters.moves += len(src)
        self.counters.moved_bytes += len(src) * self.page_bytes

    def fresh_pages(self, old: Extent, new: Extent) -> torch.Tensor:
        """The pages an extent change added at the frontier, ascending."""
        if new.low < old.low and not old.transparent:
            return self.backend.arange(new.low, old.low)
        if new.high > old.high and not old.transparent:
            return self.backend.arange(old.high, new.high)
        return self.backend.arange(new.low, new.high)

    def table_violations(self, live: int) -> list[str]:
        """Inverse tables, live count and live pages inside the occupied range."""
        out: list[str] = []
        v2p, p2v = self.v2p[1:], self.p2v[1:]
        bound_v = torch.nonzero(v2p >= 0).flatten() + 1
        bound_p = torch.nonzero(p2v >= 0).flatten() + 1
        if bound_v.numel() != live or bound_p.numel() != live:
            out.append(
                f"[{self.name}] live pages {live} != bound virtual {bound_v.numel()} "
                f"/ bound physical {bound_p.numel()}"
            )
            return out
        phys = self.v2p[bound_v]
        if not torch.equal(self.p2v[phys], bound_v):
            out.append(f"[{self.name}] v2p and p2v are not inverse on live pages")
        e = self.extent()
        if e.kind not in (Kind.BUDGET,) and live:
            lo, hi = int(phys.min()), int(phys.max())
            top = e.cap if e.kind is Kind.REGION else e.high
            if lo < e.low or hi >= top or lo < self.geom.min_page:
                out.append(
                    f"[{self.name}] live pages span [{lo}, {hi}] outside the "
                    f"occupied range [{e.low}, {top})"
                )
        return out
