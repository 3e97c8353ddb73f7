"""What every band allocator shares: geometry, page tables, moves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from unikv.extent import Extent, Kind, take
from unikv.hazards import Epoch, Hazards
from unikv.ids import SMALL
from unikv.layout import BandGeometry
from unikv.stats import BandCounters
from unikv.tables import PageTables

if TYPE_CHECKING:
    from unikv.backends.base import Backend

EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class BandContext:
    """What a band receives from the pool that builds it (no chain: a call
    that needs the other bands' extents is handed them)."""

    backend: Backend
    buffer: Any  # the backend's uint8 device array, or None (byte accounting only)
    epoch: Epoch
    hazards: Hazards
    tables: PageTables  # the pool's table arena; this band's tables are named after it
    lazy: bool  # END bands: lazy (True) or eager (False) compaction
    move_cap: int  # most survivor moves one non-urgent flush makes
    total_bytes: int  # the buffer's size
    sink_bytes: int  # the buffer's lowest bytes, holding no data
    regions: dict[str, tuple[int, int]] | None = None  # static split: band name -> (low, high) pages


class BandAllocator:
    """One band's mechanism: its page tables and its occupied range.

    Subclasses define how pages are taken and returned (`take`, `release`),
    what a flush does, and their own conservation checks. Page tables (host
    int64 arrays, mirrored on the device as `v2p_dev` / `p2v_dev`):
    `v2p[v]` is the physical page of virtual page `v` (-1 unbound) and
    `p2v[p]` its inverse; entry 0 of both is the sink. Page lists (holes,
    pages taken or freed) are host int64 arrays.
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
        self.tables = ctx.tables
        view = ctx.tables.views[self.name]
        self.v2p, self.p2v = view.v2p, view.p2v
        self.v2p_dev, self.p2v_dev = view.v2p_dev, view.p2v_dev
        self._v_at, self._p_at = view.v2p_at, view.p2v_at
        # Tables whose device arena is the host's (the sim backend) have no
        # mirror to mark stale: the table writes skip `touch` altogether.
        self._mirrored = not ctx.tables.shared
        self.reset()

    # -- state every subclass defines --

    holes: np.ndarray = EMPTY  # a band with no holes (the oracle's budget) keeps this

    if TYPE_CHECKING:  # every subclass defines it: a `Tracked` value, or derived (float)
        @property
        def live(self) -> int:
            """Bound pages."""

    def reset(self) -> None:
        """Return to the empty state (tables are reset by `clear`)."""
        raise NotImplementedError

    def extent(self) -> Extent:
        raise NotImplementedError

    def take(self, chain: Sequence[Extent], n: int) -> np.ndarray | None:
        """Physical pages for `n` new live pages, or None (state unchanged):
        the holes the chain arithmetic drains, then the fresh frontier pages.
        `chain`: every band's extent now (`Chain.extents()`)."""
        new = take(chain, self.index, n, self.total_bytes)
        if new is None:
            return None
        return self.adopt(chain[self.index], new)

    def adopt(self, old: Extent, new: Extent) -> np.ndarray:
        """Move from extent `old` (the current one) to `new`, a take the
        chain arithmetic planned; return the physical pages it adds."""
        drain = old.holes - new.holes
        drained = self.holes[:drain]
        if drain:  # else keep the very array (an END band memoises on it)
            self.holes = self.holes[drain:]
        self.apply_extent(new)
        if new.live - old.live == drain:
            return drained
        fresh = self.fresh_pages(old, new)
        return np.concatenate([drained, fresh]) if drain else fresh

    def apply_extent(self, new: Extent) -> None:
        """Adopt the frontier and live count of `new` after a take."""
        raise NotImplementedError

    def take_holes(self, n: int) -> np.ndarray:
        """The first `n` holes as new live pages (`n <= len(holes)`): what
        a take does when the holes cover it (`adopt` of a drain-only plan,
        the frontier unchanged), without the chain arithmetic."""
        drained = self.holes[:n]
        self.holes = self.holes[n:]
        self.gain_live(n)
        return drained

    def gain_live(self, n: int) -> None:
        """Count `n` more live pages (bands whose live count is derived
        from their span and holes override this with nothing)."""
        # The checker sees the read-only `live` declared above; this runs
        # only on bands that store it (a derived one overrides this method).
        self.live = self.live + n  # type: ignore[misc]

    def release(self, p_pages: np.ndarray) -> int:
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
        """Back to empty (the pool resets the table arena itself)."""
        self.reset()

    @property
    def index(self) -> int:
        return self.geom.index

    @property
    def total_bytes(self) -> int:
        return self.ctx.total_bytes

    def bind(self, v_pages: np.ndarray, p_pages: np.ndarray) -> None:
        self.v2p[v_pages] = p_pages
        self.p2v[p_pages] = v_pages
        if self._mirrored:
            self.tables.touch(self._v_at, v_pages)
            self.tables.touch(self._p_at, p_pages)
        self.counters.allocated_pages += len(v_pages)

    def unbind(self, v_pages: np.ndarray | list[int]) -> np.ndarray:
        """Tombstone `v_pages` (all bound here; an int64 array, or a list of
        at most `SMALL` ints); return their physical pages."""
        v2p, p2v = self.v2p, self.p2v
        if len(v_pages) <= SMALL:  # a few pages: Python steps beat numpy calls
            found = []
            for v in v_pages if isinstance(v_pages, list) else v_pages.tolist():
                p = int(v2p[v])
                v2p[v] = p2v[p] = -1
                found.append(p)
            p_pages = np.array(found, dtype=np.int64)
        else:
            p_pages = v2p[v_pages]
            v2p[v_pages] = -1
            p2v[p_pages] = -1
        if self._mirrored:
            self.tables.touch(self._v_at, np.asarray(v_pages, dtype=np.int64))
            self.tables.touch(self._p_at, p_pages)
        self.counters.freed_pages += len(v_pages)
        return p_pages

    def move(self, src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray,
             disjoint: bool | None = None) -> None:
        """Copy live pages `src -> dst` and rebind their virtual pages.

        `src` and `dst` may overlap as an ordered shift: every source is read
        before any destination is written. `disjoint`: True when the caller
        knows no page is in both (the check is then skipped), None to check.
        """
        if not len(src):
            return
        s = np.asarray(src, dtype=np.int64)
        d = np.asarray(dst, dtype=np.int64)
        buffer = self.ctx.buffer
        if buffer is not None:  # bytes to copy (else the move is bookkeeping only)
            if disjoint is None:
                disjoint = len(np.intersect1d(s, d)) == 0
            self.backend.move_pages(buffer, self.page_bytes, s, d, disjoint=disjoint)
        v = self.p2v[s]
        self.p2v[s] = -1
        self.p2v[d] = v
        self.v2p[v] = d
        if self._mirrored:
            self.tables.touch(self._p_at, np.concatenate([s, d]))
            self.tables.touch(self._v_at, v)
        self.counters.moves += len(s)
        self.counters.moved_bytes += len(s) * self.page_bytes

    def fresh_pages(self, old: Extent, new: Extent) -> np.ndarray:
        """The pages an extent change added at the frontier, ascending."""
        if new.low < old.low and not old.transparent:
            return np.arange(new.low, old.low, dtype=np.int64)
        if new.high > old.high and not old.transparent:
            return np.arange(old.high, new.high, dtype=np.int64)
        return np.arange(new.low, new.high, dtype=np.int64)

    def table_violations(self, live: int) -> list[str]:
        """Inverse tables, live count and live pages inside the occupied range."""
        out: list[str] = []
        bound_v = np.flatnonzero(self.v2p[1:] >= 0) + 1
        bound_p = np.flatnonzero(self.p2v[1:] >= 0) + 1
        if len(bound_v) != live or len(bound_p) != live:
            out.append(
                f"[{self.name}] live pages {live} != bound virtual {len(bound_v)} "
                f"/ bound physical {len(bound_p)}"
            )
            return out
        phys = self.v2p[bound_v]
        if not np.array_equal(self.p2v[phys], bound_v):
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
