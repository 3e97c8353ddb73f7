"""The lazy END flush against a plain reference, in lockstep on random ops.

`EndBand.flush` keeps the hole list sorted from one flush to the next and
walks survivors with a pointer into it. The reference here re-sorts the
whole list, absorbs through a set and plans over a set at every flush (the
flush as first written). Both pools see the same allocs, frees, window
releases, in-flight forwards and flushes; after every op their hole lists
(in drain order), watermarks, pending pages, page tables, returns and
counters must be identical.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from factories import full_swa

from unikv import Band, Layout, UnifiedPool
from unikv.backends import SimBackend
from unikv.backends.sim import SimEvent
from unikv.bands import UNIFIED_BANDS, EndBand
from unikv.layout import Grow


class ReferenceEndBand(EndBand):
    """The lazy flush without its incremental structures."""

    def flush(self, urgent: bool) -> int:
        if not self.lazy:
            return 0
        self.counters.flushes += 1
        self.counters.urgent_flushes += int(urgent)
        if not self.pending and len(self.holes) == 0:
            return 0
        self._drain_pending(urgent)
        holes = self._reference_absorb(sorted(self.holes.tolist()))
        if not holes:
            return 0
        if urgent:
            self.ctx.hazards.settle()
            cap, blocked = None, set()
        else:
            written = self.ctx.hazards.written(self.name)
            cap, blocked = self.ctx.move_cap, {int(self.v2p[v]) for v in written if self.v2p[v] >= 0}
        srcs, dsts = self._reference_plan(holes, cap, blocked)
        if not srcs:
            return 0
        self.move(srcs, dsts)
        left = [h for h in holes if h not in set(dsts)]
        reader = None if urgent else self.ctx.hazards.pending_event()
        if reader is not None:
            self.pending.append((reader, srcs))
            self.pending_set.update(srcs)
            self.counters.pending_peak = max(self.counters.pending_peak, len(self.pending_set))
        else:
            left += srcs
        self._reference_absorb(sorted(left))
        return len(srcs)

    def _reference_absorb(self, holes: list[int]) -> list[int]:
        free = set(holes)
        wm = self.watermark
        while (wm - 1 if self.up else wm) in free:
            free.discard(wm - 1 if self.up else wm)
            wm += -1 if self.up else 1
        if wm != self.watermark:
            self.counters.absorbed_pages += abs(wm - self.watermark)
            self.watermark = wm
        rest = sorted(free)
        self.holes = np.array(rest if self.up else rest[::-1], dtype=np.int64)
        return rest

    def _reference_plan(self, holes, cap, blocked):
        skip = set(holes) | self.pending_set
        low, high = self.span()
        outer = range(high - 1, low - 1, -1) if self.up else range(low, high)
        survivors = iter([p for p in outer if p not in skip])
        srcs, dsts = [], []
        for dst in holes if self.up else reversed(holes):
            src = next(survivors, None)
            if src is None or (src < dst if self.up else src > dst):
                break
            if src in blocked or (cap is not None and len(srcs) >= cap):
                break
            srcs.append(src)
            dsts.append(dst)
        return srcs, dsts


class ReferencePool(UnifiedPool):
    band_classes = {**UNIFIED_BANDS, Grow.UP: ReferenceEndBand, Grow.DOWN: ReferenceEndBand}


def state(pool) -> list:
    out = [pool.stats(), pool.hazards.settles]
    for b in pool.chain.bands:
        out += [b.name, b.watermark, b.live, b.holes.tolist(), sorted(b.pending_set),
                [sorted(pages) for _, pages in b.pending], b.v2p.tolist(), b.p2v.tolist()]
    return out


class Lockstep:
    """One random op at a time on the pool under test and the reference."""

    def __init__(self, layout: Layout, rng: random.Random, move_cap: int) -> None:
        self.pools = [cls(layout, backend=SimBackend(), compaction="lazy", move_cap=move_cap)
                      for cls in (UnifiedPool, ReferencePool)]
        self.rng = rng
        self.reqs: list[list[int]] = []  # token ids per request (same in both pools)
        self.events: list[tuple[SimEvent, SimEvent]] = []

    def both(self, op):
        got = [op(p, k) for k, p in enumerate(self.pools)]
        assert got[0] == got[1], got
        assert state(self.pools[0]) == state(self.pools[1])

    def step(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            n = rng.randint(1, 6)
            ids = [None, None]

            def alloc(p, k):
                v = p.alloc(n * p.page_size)
                ids[k] = None if v is None else v.tolist()
                return ids[k]
            self.both(alloc)
            if ids[0] is not None:
                self.reqs.append(ids[0])
        elif r < 0.55 and self.reqs:
            req = self.reqs.pop(rng.randrange(len(self.reqs)))
            self.both(lambda p, k: p.free(req))
        elif r < 0.7 and self.reqs:  # a window release on the swa band
            req = rng.choice(self.reqs)
            ids = req[:rng.randint(1, len(req))]
            self.both(lambda p, k: p.release(ids, "swa"))
        elif r < 0.8:
            writes = [t for req in self.reqs if rng.random() < 0.5 for t in req[-1:]]
            pair = (SimEvent("a"), SimEvent("b"))
            self.events.append(pair)
            self.both(lambda p, k: p.set_inflight_forward(pair[k], writes or None))
        elif r < 0.87 and self.events:
            for ev in self.events.pop(0):
                ev.fire()
        else:
            urgent = rng.random() < 0.15
            self.both(lambda p, k: p.flush(urgent=urgent))


def small_layout(up_first: bool) -> Layout:
    bands = [Band("full", entry_bytes=200, grow="up"), Band("swa", entry_bytes=100, grow="down")]
    if not up_first:
        bands = [Band("swa", entry_bytes=100, grow="up"), Band("full", entry_bytes=200, grow="down")]
    return Layout(total_bytes=20_000, bands=bands)


@pytest.mark.parametrize("vector", [False, True], ids=["walk", "numpy"])
@pytest.mark.parametrize("seed", range(12))
def test_lazy_flush_matches_the_reference(seed, vector, monkeypatch):
    if vector:  # every pack planned by `_plan_pack_vector`, however few holes
        monkeypatch.setattr("unikv.bands.end.VECTOR_PACK", 1)
    rng = random.Random(seed)
    layout = full_swa() if seed % 3 == 0 else small_layout(up_first=seed % 2 == 0)
    run = Lockstep(layout, rng, move_cap=rng.choice([1, 3, 4096]))
    for _ in range(600):
        run.step()
    assert run.pools[0].verify() == []
