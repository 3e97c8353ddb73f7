"""Core bugs the chain fuzzer found, each as its shrunk, hand-checked example.

Each test states the behaviour the core should have. An open bug's test is
marked `xfail(strict=True)`: a fix turns it into an XPASS, which fails the
run; then drop the mark, and the matching `chain_setup.KNOWN_BUGS` entry and
guard, so the fuzzer checks that behaviour again. A fixed bug's test stays
as an ordinary regression test. docs/fuzzing.md describes each bug, its
cause and the fix.
"""

from __future__ import annotations

import pytest

from unikv import Band, Layout, OraclePool, UnifiedPool
from unikv.backends import SimBackend


# -- OraclePool: the byte budget is larger than a band's page grid --

def oracle_state_layout() -> Layout:
    """Sink 120 B (a 4 x 30 B page); mamba's grid: 10 slots, the first
    usable one is 2 (200 B), so 8 usable slots; budget 1090 - 120 = 970 B
    = 9 slots of 100 B."""
    return Layout(total_bytes=1090, bands=[
        Band("mamba", entry_bytes=100, grow="up", unit="request"),
        Band("full", entry_bytes=30, grow="down", page_size=4),
    ])


def test_oracle_available_state_fits_the_page_grid():
    """Was: available_state() 9 with 8 slot ids; alloc_state(9) crashed in
    bind (fixed in 2bbbfb8: the budget room is capped by the band's grid)."""
    layout = oracle_state_layout()
    pool = OraclePool(layout)
    n = pool.available_state("mamba")
    assert n <= layout.geometry("mamba").usable_pages
    ids = pool.alloc_state("mamba", n)
    assert ids is not None and pool.verify() == []


def test_oracle_available_size_fits_the_page_grid():
    """Was: available_size() 6 with 5 usable pages of 'full'; alloc(6)
    crashed in bind (same fix)."""
    # Sink 1000 B; full's grid: 9 slots, the first usable one is 4, so 5
    # usable pages; budget 2990 - 1000 = 1990 B = 6 pages of 300 B.
    layout = Layout(total_bytes=2990, bands=[
        Band("mamba", entry_bytes=1000, grow="up", unit="request"),
        Band("full", entry_bytes=300, grow="down", page_size=1),
    ])
    pool = OraclePool(layout)
    n = pool.available_size()
    assert n <= layout.geometry("full").usable_pages
    assert pool.alloc(n) is not None and pool.verify() == []


# -- the shortfall ladder over a float --

def ladder_pool(materialize: bool = False) -> UnifiedPool:
    """mamba 5000 B (up) | swa 300 B/token (float) | full 700 B/token (down),
    page_size 1, lazy; the fuzzer's shrunk sequence. Afterwards:

    mamba [5000, 20000): 2 live slots + 1 hole (its lowest slot);
    swa   [20100, 23400): 2 live pages at the bottom, 9 holes above them;
    full  [32200, 39900): 2 live pages at the top, 9 holes below them.
    available_size() = 17, available_size(schedulable=True) = 21.
    """
    layout = Layout(total_bytes=40_000, bands=[
        Band("mamba", entry_bytes=5000, grow="up", unit="request"),
        Band("swa", entry_bytes=300, grow="float", page_size=1),
        Band("full", entry_bytes=700, grow="down", page_size=1),
    ])
    pool = UnifiedPool(layout, backend=SimBackend(materialize=materialize), compaction="lazy")
    a = pool.alloc(1)
    b = pool.alloc(9)
    s = pool.alloc_state("mamba", 3)
    pool.free(a)
    pool.alloc(2)
    pool.alloc(9)
    pool.free(b)
    pool.free_state("mamba", s[:1])
    return pool


def test_ladder_pool_is_as_documented():
    pool = ladder_pool()
    occ = pool.occupancy()["bands"]
    assert [(occ[n]["low_byte"], occ[n]["high_byte"], occ[n]["live_pages"], occ[n]["hole_pages"])
            for n in ("mamba", "swa", "full")] == [
        (5000, 20000, 2, 1), (20100, 23400, 2, 9), (32200, 39900, 2, 9)]
    assert (pool.available_size(), pool.available_size(schedulable=True)) == (17, 21)
    assert pool.verify() == []


@pytest.mark.xfail(strict=True, reason=(
    "core: the ladder cannot realise the schedulable view: its float flush absorbs the float's 9 "
    "boundary holes (a coupled take can use holes anywhere, the absorbed gap only on one side, "
    "where full also grows), then open_short_side's make_room(LOW, ...) leapfrogs the float "
    "against full's frontier, walling full in; alloc(21) returns None although it fits"))
def test_ladder_realises_the_schedulable_view():
    pool = ladder_pool()
    n = pool.available_size(schedulable=True)
    assert pool.alloc(n) is not None
    assert pool.verify() == []


@pytest.mark.xfail(strict=True, reason=(
    "core: a failing ladder leaves less room than it found: make_room's leapfrog packs the "
    "float against full's frontier before the re-check fails, so available_size() drops 17 -> 0"))
def test_a_failed_ladder_keeps_the_room_it_found():
    pool = ladder_pool()
    before = pool.available_size()
    # 23 tokens need 23 x 1000 B plus the float's 600 live bytes: more than
    # the 23 500 B between mamba and full even after packing. It must fail.
    assert pool.alloc(23) is None
    assert pool.available_size() >= before
    assert pool.verify() == []
