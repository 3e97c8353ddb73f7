"""The fuzzer bites: realistic bugs planted in the core, one at a time, are
caught by the `ci`-profile state machine.

Each plant is a monkeypatch of one core function with the kind of slip a
maintainer could make (an off-by-one, a forgotten table wipe, a cache that
ignores its key, a hazard check that returns nothing, ...). The machine runs
programmatically with the ci profile's settings, no shrinking and a bounded
number of examples, restricted to the pool kind and chain shapes the plant
can affect; it must raise.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import HypothesisException
from hypothesis.stateful import run_state_machine_as_test

import unikv.extent as extent_mod
from unikv import UnifiedPool, paged
from unikv.bands import BandAllocator, EndBand
from unikv.chain import EpochMemo
from unikv.extent import float_region
from unikv.hazards import Hazards
from unikv.ids import IdSpace
from unikv.testing.machine import machine_for

# Bounds, not targets: a run stops at its first failure. The hazard plants
# need an in-flight forward, holes and a non-urgent flush in one step, so
# they get a wider bound (docs/fuzzing.md has measured catch times).
MAX_EXAMPLES = 300
HAZARD_MAX_EXAMPLES = 1500
FLOAT_CHAINS = ("up|float|down", "state|float|down")


# -- the plants (each takes pytest's monkeypatch) --

def eager_retreat_off_by_one(mp) -> None:
    """Eager compaction retreats the watermark one page too far."""
    real = EndBand._compact_now

    def planted(self, freed):
        moves = real(self, freed)
        if self.live:
            self.watermark = self.watermark - 1 if self.up else self.watermark + 1
        return moves
    mp.setattr(EndBand, "_compact_now", planted)


def absorb_off_by_one(mp) -> None:
    """Lazy flush absorbs one page past the last frontier hole."""
    real = EndBand._absorb

    def planted(self, holes):
        before = self.watermark
        rest = real(self, holes)
        if self.watermark != before and self.live:
            self.watermark = self.watermark - 1 if self.up else self.watermark + 1
        return rest
    mp.setattr(EndBand, "_absorb", planted)


def remap_keeps_stale_p2v(mp) -> None:
    """The remap after a move forgets to wipe `p2v` at the sources."""
    def planted(self, src, dst):
        if not len(src):
            return
        s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        self.backend.move_pages(self.ctx.buffer, self.page_bytes, s, d)
        v = self.p2v[s]
        self.p2v[d] = v
        self.v2p[v] = d
        self.counters.moves += len(s)
        self.counters.moved_bytes += len(s) * self.page_bytes
    mp.setattr(BandAllocator, "move", planted)


def memo_ignores_epoch(mp) -> None:
    """A capacity memo answers whatever epoch it was computed at."""
    def planted(self, key, compute):
        hit = self.entries.get(key)
        if hit is not None:
            return hit[1]
        value = compute()
        self.entries[key] = (self.epoch.value, value)
        return value
    mp.setattr(EpochMemo, "get", planted)


def flush_ignores_write_set(mp) -> None:
    """A non-urgent flush moves pages the running forward writes."""
    mp.setattr(Hazards, "written", lambda self, name: set())


def float_midpoint_ignores_size(mp) -> None:
    """A transparent float centres its start, not its span, in the free region."""
    real = extent_mod._float_extend

    def planted(chain, i, ext, total_bytes):
        if not chain[i].transparent:
            return real(chain, i, ext, total_bytes)
        lo, hi = float_region(chain, i, total_bytes)
        start = lo + (hi - lo) // 2
        return start, start + ext
    mp.setattr(extent_mod, "_float_extend", planted)


def pending_reused_early(mp) -> None:
    """Pages a non-urgent flush vacated are reused before the forward that
    reads them has finished."""
    def planted(self, urgent):
        ready = [p for _, pages in self.pending for p in pages]
        self.pending, self.pending_set = [], set()
        if ready:
            self.holes = np.concatenate([self.holes, np.asarray(ready, dtype=np.int64)])
    mp.setattr(EndBand, "_drain_pending", planted)


def id_returned_while_bound(mp) -> None:
    """A release returns a virtual page to the free list while another band
    still binds it."""
    def planted(self, ids):
        if len(ids):
            self.binds[ids] -= 1
            self._push(ids)
    mp.setattr(IdSpace, "drop", planted)


def page_representatives_skip(mp) -> None:
    """A window release with a mid-page `start_pos` skips the second page."""
    def planted(ids, start_pos, page_size):
        offset = start_pos % page_size
        if page_size == 1 or len(ids) == 0 or offset == 0:
            return ids if page_size == 1 or len(ids) == 0 else ids[::page_size]
        return np.concatenate([ids[:1], ids[page_size - offset + page_size::page_size]])
    mp.setattr(paged, "page_representatives", planted)


def kernel_ids_ignore_blocks(mp) -> None:
    """Kernel-facing translation forgets the blocks-per-page multiplier."""
    real = paged.translate

    def planted(ids, v2p, page_size, multiplier=1):
        return real(ids, v2p, page_size, 1)
    mp.setattr(paged, "translate", planted)


class Plant(NamedTuple):
    patch: Callable
    kind: str  # the pool kind the machine runs
    chains: tuple  # the chain shapes it draws
    caught_by: str  # regex the failure message must match
    max_examples: int = MAX_EXAMPLES


PLANTS = {
    "eager_retreat_off_by_one": Plant(eager_retreat_off_by_one, "eager", ("up|down", "state|down", "down"),
                                      r"span|outside|overlap|wrong bytes"),
    "absorb_off_by_one": Plant(absorb_off_by_one, "lazy", ("up|down", "state|down", "up"),
                               r"span|outside|overlap|wrong bytes"),
    "remap_keeps_stale_p2v": Plant(remap_keeps_stale_p2v, "eager", ("up|down", "state|float|down"),
                                   r"bound physical|inverse|overlap"),
    "memo_ignores_epoch": Plant(memo_ignores_epoch, "lazy", ("up|down", "state|float|down"),
                                r"stale|available_size|needed the ladder|returned None"),
    "flush_ignores_write_set": Plant(flush_ignores_write_set, "lazy", ("up|down", "down", "state|down"),
                                     r"wrong bytes", HAZARD_MAX_EXAMPLES),
    "float_midpoint_ignores_size": Plant(float_midpoint_ignores_size, "lazy", FLOAT_CHAINS,
                                         r"overlap|outside|refused"),
    "pending_reused_early": Plant(pending_reused_early, "lazy", ("up|down", "down", "state|down"),
                                  r"read hazard|wrong bytes", HAZARD_MAX_EXAMPLES),
    "id_returned_while_bound": Plant(id_returned_while_bound, "lazy", ("up|down", "up|float|down"),
                                     r"free id|bind counts|free virtual ids|not a free page|bound"),
    "page_representatives_skip": Plant(page_representatives_skip, "eager", ("up|down", "up|float|down"),
                                       r"bound pages differ|live_bytes"),
    "kernel_ids_ignore_blocks": Plant(kernel_ids_ignore_blocks, "static", ("down", "up|float|down"),
                                      r"kernel-facing ids"),
}


def run_machine(plant: Plant, name: str) -> None:
    """The machine under the ci profile, bounded, without shrinking."""
    ci = settings.get_profile("ci")
    run_state_machine_as_test(
        machine_for(plant.kind, plant.chains, name=f"Planted_{name}"),
        settings=settings(ci, max_examples=plant.max_examples, phases=[Phase.generate],
                          report_multiple_bugs=False, suppress_health_check=list(HealthCheck)),
    )


@pytest.mark.parametrize("name", PLANTS)
def test_planted_bug_is_caught(name, monkeypatch):
    plant = PLANTS[name]
    plant.patch(monkeypatch)
    with pytest.raises(Exception) as info:
        run_machine(plant, name)
    assert not isinstance(info.value, HypothesisException), f"not a finding: {info.value!r}"
    assert re.search(plant.caught_by, str(info.value)), f"caught, but not by the intended check: {info.value}"


@pytest.mark.parametrize("name", [n for n, p in PLANTS.items() if p.max_examples == MAX_EXAMPLES])
def test_planted_bug_is_caught_with_verify_blinded(name, monkeypatch):
    """The machine's own checks (model, bytes, overlap, memo, fresh-pool
    comparisons) catch each plant even when the pool's verify() says all
    is well. (The hazard plants are caught by byte checks alone already.)"""
    plant = PLANTS[name]
    plant.patch(monkeypatch)
    monkeypatch.setattr(UnifiedPool, "verify", lambda self: [])
    with pytest.raises(Exception) as info:
        run_machine(plant, f"{name}_blind")
    assert not isinstance(info.value, HypothesisException), f"not a finding: {info.value!r}"

