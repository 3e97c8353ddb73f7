"""END bands: grow from one buffer end, compacted eagerly or lazily.

Live pages sit between the buffer end and the watermark. Eager compaction
keeps that range dense at every free; lazy compaction lets frees leave holes
(reused first by allocs) and packs the band at flush time.
"""

from __future__ import annotations

import numpy as np

from unikv.bands.base import EMPTY, BandAllocator
from unikv.extent import Extent, Kind, new_extent
from unikv.hazards import Tracked
from unikv.layout import Grow

VECTOR_PACK = 48  # hole lists this long are paired in numpy (`_plan_pack_vector`)


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
        self.lazy = self.ctx.lazy  # lazy (True) or eager compaction: fixed per pool
        self.live = 0
        self._reset_frontier()
        # Pages a move vacated while the forward still read them:
        # [(event, pages: a list, or an int64 array)], oldest first.
        self.pending: list[tuple[object, list[int] | np.ndarray]] = []
        self.pending_set: set[int] = set()
        # The hole array the last absorb left, the array owning its memory
        # and its pages ascending (None until a pack asks): while `holes` is
        # that array or a view of its owner, it is sorted and touches no
        # frontier (allocs drain holes by slicing the array and extend with
        # live pages), so a flush needs no second sort and absorb
        # (`_absorb_holes`).
        self._absorbed: tuple[np.ndarray, np.ndarray, list[int] | None] = (EMPTY, EMPTY, [])

    def _reset_frontier(self) -> None:
        self.watermark = self.geom.min_page if self.up else self.geom.num_pages
        self.holes = EMPTY

    def span(self) -> tuple[int, int]:
        if self.up:
            return self.geom.min_page, self.watermark
        return self.watermark, self.geom.num_pages

    def extent(self) -> Extent:
        g = self.geom
        if self.up:
            low, high = g.min_page, self.watermark
        else:
            low, high = self.watermark, g.num_pages
        return new_extent(Extent, (self.kind, g.page_bytes, g.min_page, g.num_pages, low, high,
                                   len(self.holes), self.live, 0))

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
            elif len(self.holes):
                self.holes = np.concatenate([self.holes, p_pages])
            else:  # the freed pages are the hole list (`unbind` built them afresh)
                self.holes = p_pages
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
        counters = self.counters
        counters.flushes += 1
        if urgent:
            counters.urgent_flushes += 1
        if self.pending:
            self._drain_pending(urgent)
        elif len(self.holes) == 0:
            return 0  # nothing freed since the last flush
        if not self._absorb_holes():
            return 0
        hazards = self.ctx.hazards
        if urgent:
            hazards.settle()
        else:
            # Forget a finished forward, as before any plan; then the usual
            # blocked case, without the walk: the frontier page is live
            # (absorbed holes never touch it), so it is the first survivor
            # the pack would move.
            if hazards.pending_event() is not None and not self.pending_set:
                frontier = int(self.p2v[self.watermark - 1 if self.up else self.watermark])
                if hazards.writes_page(self.name, frontier):
                    return 0
        cap = None if urgent else self.ctx.move_cap
        if len(self.holes) >= VECTOR_PACK:  # planned on the stored array: no ascending list built
            holes = None
            srcs, dsts = self._plan_pack_vector(cap, urgent)
        else:
            holes = self._ascending()
            srcs, dsts = self._plan_pack(holes, cap, urgent)
        if not len(srcs):
            return 0  # nothing moved: the hole list stays as absorbed
        # Survivors are live pages, holes free ones: never the same page.
        self.move(srcs, dsts, disjoint=True)
        # The destinations were the deepest holes: the deep end of the list.
        rest = self.holes[len(dsts):]
        reader = None if urgent else hazards.pending_event()
        if reader is not None:
            self.pending.append((reader, srcs))
            self.pending_set.update(srcs if isinstance(srcs, list) else srcs.tolist())
            counters.pending_peak = max(counters.pending_peak, len(self.pending_set))
            # The holes left are the stored list less its deepest: a view.
            # They were absorbed already, and no vacated page joined them.
            left = None if holes is None else holes[len(dsts):] if self.up else holes[:len(holes) - len(dsts)]
            self._keep(left, rest)
        else:
            ordered = np.concatenate([rest, np.asarray(srcs, dtype=np.int64)])
            ordered.sort()  # the method: no Python wrapper, unlike np.sort
            self._keep(None, self._absorb(ordered))
        return len(srcs)

    def _drain_pending(self, urgent: bool) -> None:
        """Return vacated pages whose reader finished to the hole list
        (each pending entry's pages: a list, or an int64 array from
        `_plan_pack_vector`)."""
        keep, ready = [], []
        for event, pages in self.pending:
            if urgent and not self.backend.event_done(event):
                self.backend.wait_event(event)
            if self.backend.event_done(event):
                ready.append(pages)
            else:
                keep.append((event, pages))
        self.pending = keep
        if not ready:
            return
        if keep:
            for pages in ready:
                self.pending_set.difference_update(pages if isinstance(pages, list) else pages.tolist())
        else:  # every reader finished (the usual case): nothing stays pending
            self.pending_set.clear()
        self.holes = np.concatenate([self.holes, *(np.asarray(p, dtype=np.int64) for p in ready)])

    def _absorb_holes(self) -> bool:
        """Sort the hole list (deepest first) and absorb the holes touching
        the frontier; whether any hole is left.

        The last absorb's hole array is remembered with the array owning
        its memory (and, once a pack asked for it, its pages ascending as a
        list). Allocs drain it from the deep end by slicing, so a view of
        that array means drains only: the same pages minus the deepest,
        still in order and clear of the frontier. Anything else (pages
        appended by frees) is sorted again.
        """
        array, owner, ascending = self._absorbed
        holes = self.holes
        if holes is array:
            return len(holes) > 0
        if holes.base is owner:  # drained from the deep end only
            n = len(holes)
            if ascending is not None:
                ascending = ascending[len(ascending) - n:] if self.up else ascending[:n]
            self._absorbed = (holes, owner, ascending)
            return n > 0
        ordered = holes.copy()
        ordered.sort()  # np.sort, without its Python wrapper
        if len(ordered) and int(ordered[-1] if self.up else ordered[0]) != (
                self.watermark - 1 if self.up else self.watermark):
            # no hole touches the frontier (the usual case): nothing to absorb
            self._keep(None, ordered if self.up else ordered[::-1])
            return True
        rest = self._absorb(ordered)
        self._keep(None, rest)
        return len(rest) > 0

    def _ascending(self) -> list[int]:
        """The absorbed holes' pages ascending (`_absorb_holes` first)."""
        array, owner, ascending = self._absorbed
        if ascending is None:
            ascending = array.tolist() if self.up else array[::-1].tolist()
            self._absorbed = (array, owner, ascending)
        return ascending

    def _absorb(self, ordered: np.ndarray) -> np.ndarray:
        """Retreat the watermark past the holes touching it; return the
        others, deepest first (the stored order). `ordered`: the holes,
        distinct and ascending.

        The holes touching the frontier are the run of consecutive pages
        that ends at it: where `ordered[j] - j` (non-decreasing, for
        distinct ascending ints) takes its frontier value.
        """
        n, wm = len(ordered), self.watermark
        steps = ordered - np.arange(n, dtype=np.int64)
        if self.up:  # the top of the list: ordered[j] == wm - n + j
            keep = int(np.searchsorted(steps, wm - n, side="left"))
            absorbed, rest = n - keep, ordered[:keep]
            wm -= absorbed
        else:  # the bottom: ordered[j] == wm + j
            absorbed = int(np.searchsorted(steps, wm, side="right"))
            rest = ordered[absorbed:][::-1]
            wm += absorbed
        if absorbed:
            self.counters.absorbed_pages += absorbed
            self.watermark = wm
        return rest

    def _keep(self, holes: list[int] | None, stored: np.ndarray | None = None) -> None:
        """Make `holes` (ascending) the hole list, deepest first.
        `stored`: that list as an array already (a view is fine); `holes`
        may then be None, for `_ascending` to build on demand."""
        if stored is None:
            if holes is None:
                raise ValueError("internal: _keep needs the holes as a list or as an array")
            stored = np.array(holes if self.up else holes[::-1], dtype=np.int64)
        self.holes = stored
        owner = stored if stored.base is None else stored.base
        self._absorbed = (stored, owner, holes)

    def _plan_pack(self, holes: list[int], cap: int | None, urgent: bool):
        """Pair the outermost survivors with the deepest holes (`holes`
        ascending, as the last absorb left them) until the two walks cross
        (the band is then dense below its frontier).

        The survivor walk steps in from the frontier past holes (a pointer
        into `holes` from its frontier end) and pending pages. Non-urgent,
        it stops at a page the running forward writes (by its virtual page:
        `Hazards.written`).
        """
        up, n = self.up, len(holes)
        pending = self.pending_set
        low, high = self.span()
        step = -1 if up else 1  # the survivor walk's direction
        p = high - 1 if up else low  # the next survivor candidate
        k = n - 1 if up else 0  # the hole nearest the frontier not yet passed
        blocked = None
        srcs: list[int] = []
        dsts: list[int] = []
        for dst in holes if up else reversed(holes):
            while (dst - p) * step >= 0:  # not yet crossed
                if 0 <= k < n and holes[k] == p:
                    k += step
                elif p not in pending:
                    break  # p is a survivor
                p += step
            else:
                break  # crossed: the band is dense below its frontier
            if cap is not None and len(srcs) >= cap:
                break
            if not urgent:
                if blocked is None:
                    blocked, p2v = self.ctx.hazards.written(self.name), self.p2v
                if blocked and int(p2v[p]) in blocked:
                    break
            srcs.append(p)
            dsts.append(dst)
            p += step
        return srcs, dsts

    def _plan_pack_vector(self, cap: int | None, urgent: bool) -> tuple[np.ndarray, np.ndarray]:
        """`_plan_pack` in numpy, for long hole lists, over the stored hole
        array (`_absorb_holes` first); the pairs as int64 arrays. The j-th
        survivor from the frontier pairs with the j-th deepest hole while
        it lies beyond it (survivors fall, holes rise, so the pairs that do
        form a prefix); then the cap, then the first page the running
        forward writes."""
        deep = self.holes  # deepest first: ascending growing up, descending growing down
        n = len(deep)
        low, high = self.span()
        # The n outermost survivors lie in the n + |holes| + |pending| pages
        # next to the frontier.
        width = min(high - low, 2 * n + len(self.pending_set))
        start = high - width if self.up else low
        free = np.zeros(width, dtype=bool)
        near = deep[(deep >= start) & (deep < start + width)]
        free[near - start] = True
        if self.pending:  # its entries' pages are `pending_set`
            pend = np.concatenate([np.asarray(p, dtype=np.int64) for _, p in self.pending])
            free[pend[(pend >= start) & (pend < start + width)] - start] = True
        pages = np.arange(start, start + width, dtype=np.int64)
        survivors = pages[~free]
        if self.up:
            survivors = survivors[::-1]  # from the frontier inward
        k = min(len(survivors), n)
        srcs, dsts = survivors[:k], deep[:k]
        k = int(np.count_nonzero(srcs > dsts if self.up else srcs < dsts))
        if cap is not None:
            k = min(k, cap)
        if not urgent and k:
            blocked = self.ctx.hazards.written(self.name)
            if blocked:
                moved = self.p2v[srcs[:k]].tolist()
                if not blocked.isdisjoint(moved):  # one C-level pass; the index only when one is hit
                    k = next(j for j, v in enumerate(moved) if v in blocked)
        return srcs[:k], dsts[:k]

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
