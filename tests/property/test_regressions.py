"""Core bugs the chain fuzzer found, each as its shrunk, hand-checked example.

Each test states the behaviour the core should have. An open bug's test is
marked `xfail(strict=True)`: a fix turns it into an XPASS, which fails the
run; then drop the mark, and the matching `unikv.testing.pools.KNOWN_BUGS` entry and
guard, so the fuzzer checks that behaviour again. A fixed bug's test stays
as an ordinary regression test. docs/fuzzing.md describes each bug, its
cause and the fix.
"""

from __future__ import annotations

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
    page_size 1, lazy; the fuzzer's shrunk sequence. Its fifth call was a
    failing `alloc(9)` (12,300 B needed, 12,200 B free) whose ladder, before
    the fix, leapfrogged the float against mamba; a failed ladder no longer
    moves anything, so `make_room` puts the float there. Afterwards:

    mamba [5000, 20000): 2 live slots + 1 hole (its lowest slot);
    swa   [20100, 23400): 2 live pages at the bottom, 9 holes above them;
    full  [32200, 39900): 2 live pages at the top, 9 holes below them.
    available_size() = 17; after urgent flushes of mamba and full alone,
    21; through the whole ladder (those flushes, then a float slide),
    available_size(schedulable=True) = 22: mamba packs to [5000, 15000) and
    full to [38500, 39900), leaving 23,500 B for swa's 600 live bytes and
    1,000 B per new token.
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
    pool.make_room("high", 8700)  # leapfrog: swa [24900, 28200) -> [20100, 23400)
    pool.free(b)
    pool.free_state("mamba", s[:1])
    return pool


def test_ladder_pool_is_as_documented():
    pool = ladder_pool()
    occ = pool.occupancy()["bands"]
    assert [(occ[n]["low_byte"], occ[n]["high_byte"], occ[n]["live_pages"], occ[n]["hole_pages"])
            for n in ("mamba", "swa", "full")] == [
        (5000, 20000, 2, 1), (20100, 23400, 2, 9), (32200, 39900, 2, 9)]
    assert (pool.available_size(), pool.available_size(schedulable=True)) == (17, 22)
    assert pool.chain.joint_pages(pool.token_order, schedulable=True) == 21  # flushes alone
    assert pool.verify() == []


def test_ladder_realises_the_schedulable_view():
    pool = ladder_pool()
    n = pool.available_size(schedulable=True)
    assert pool.alloc(n) is not None
    assert pool.verify() == []


def test_a_failed_ladder_keeps_the_room_it_found():
    pool = ladder_pool()
    before = pool.available_size()
    # 23 tokens need 23 x 1000 B plus the float's 600 live bytes: more than
    # the 23 500 B between mamba and full even after packing. It must fail.
    relocations = pool.stats()["relocations"]
    assert pool.alloc(23) is None
    assert pool.available_size() >= before
    assert pool.stats()["relocations"] == relocations  # no planned slide fits: none made
    assert pool.verify() == []


def test_the_ladder_slides_the_float_only_as_far_as_needed():
    """22 tokens fit once the float gives full one page: the ladder drops
    swa's top boundary holes (no copy) and keeps the rest as holes."""
    pool = ladder_pool(materialize=True)
    assert pool.alloc(22) is not None
    assert pool.verify() == []


# -- a flush with a float lowered the joint room --

def test_a_flush_never_lowers_available_size_with_a_float():
    """Was: flush() absorbed the float's two low boundary holes, a page of
    room the coupled take used, and available_size() fell 27 -> 18. The
    float now keeps holes whose absorption would lower the joint room."""
    layout = Layout(total_bytes=2529, bands=[
        Band("local", entry_bytes=9, grow="up", page_size=9),
        Band("swa", entry_bytes=33, grow="float", page_size=9),
        Band("full", entry_bytes=8, grow="down", page_size=9),
    ])
    pool = UnifiedPool(layout, backend=SimBackend(materialize=True), compaction="eager")
    v = pool.alloc_extend([0], [19], [0])
    pool.release(v[:18], "swa")
    assert pool.occupancy()["bands"]["swa"]["hole_pages"] == 2
    before = pool.available_size()
    pool.flush()
    assert pool.available_size() >= before == 27
    assert pool.verify() == []
