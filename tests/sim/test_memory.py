"""The memory layer's surface toward the engine: capacity questions, the
forward's declaration and flush, samples, checks; and that it never evicts
on its own (the scheduler's shortfall path does)."""

import pytest
from unikv.sim.memory import Memory, int64_ids
from unikv.sim.request import Request

from unikv import Band, Layout, UnifiedPool
from unikv.backends import SimBackend


def memory(pages=20, mode="lazy", block=None, state=False):
    bands = [Band("full", entry_bytes=100, grow="down")]
    total = 100 + 100 * pages
    if state:
        bands.insert(0, Band("mamba", entry_bytes=400, grow="up", unit="request"))
        total = 400 + 400 + 100 * pages  # the sink, one slot, `pages` pages
    pool = UnifiedPool(Layout(total_bytes=total, bands=bands), backend=SimBackend(), compaction=mode)
    return Memory(pool, window_tokens=None, block_tokens=block)


def held(mem, *lengths):
    reqs = []
    for i, n in enumerate(lengths):
        r = Request(i, 0.0, n, 1)
        mem.take_hit(r, 0.0)
        assert mem.extend(r, n)
        reqs.append(r)
    return reqs


def test_capacity_questions_are_the_pools_schedulable_views():
    mem = memory()
    held(mem, 5)
    assert mem.room_tokens() == mem.pool.available_size(schedulable=True) == 15
    assert mem.room_tokens_bound() >= mem.room_tokens()


def test_begin_forward_flushes_and_reports_the_bytes_moved_since_the_last_call():
    mem = memory(mode="lazy")
    r0, r1 = held(mem, 8, 8)
    mem.retract(r0, 0.0)  # lazy: r0's pages become holes above r1's
    before = mem.pool.stats()["moved_bytes"]
    moved = mem.begin_forward(mem.new_event("a"), int64_ids([]), [r1])
    assert moved == mem.pool.stats()["moved_bytes"] - before > 0
    assert mem.begin_forward(mem.new_event("b"), int64_ids([]), [r1]) == 0
    assert mem.moves() == mem.pool.stats()["moves"]


def test_sample_is_taken_again_only_when_the_pool_changed():
    mem = memory()
    first = mem.sample()
    assert mem.sample() is first
    held(mem, 3)
    assert mem.sample() is not first and mem.sample() == mem.pool.sample()


def test_take_state_never_evicts():
    mem = memory(pages=8, state=True, block=4)
    r = Request(0, 0.0, 8, 1, (1, 2))
    mem.take_hit(r, 0.0)
    assert mem.take_state(r) and mem.extend(r, 8)
    mem.finish(r, 1.0)  # its blocks and state snapshot stay cached: the buffer is full
    late = Request(1, 2.0, 4, 1)
    assert not mem.take_state(late) and late.state is None and mem.evictions == 0
    assert mem.evict_some() and mem.take_state(late)


def test_verify_catches_a_page_freed_behind_the_memory_layers_back():
    mem = memory()
    (r,) = held(mem, 4)
    assert mem.verify([r]) == []
    mem.pool.free(int64_ids(r.pages[-1:]))  # page_size 1: page = token id
    assert any("pool live pages" in p for p in mem.verify([r]))


def window_only_memory(pages=24, block=None):
    """Memory over a pool whose only token band is the window band (an
    all-sliding-window model): page_size 2, window 4 tokens."""
    band = Band("swa", entry_bytes=100, grow="down", page_size=2)
    pool = UnifiedPool(Layout(total_bytes=200 + 200 * pages, bands=[band]), backend=SimBackend())
    return Memory(pool, window_tokens=4, block_tokens=block)


@pytest.mark.parametrize("end", ["finish", "retract"])
def test_a_window_only_request_never_frees_the_pages_the_ratchet_gave_back(end):
    mem = window_only_memory()
    (a,) = held(mem, 10)
    released = a.pages[:3]
    assert mem.ratchet([a]) == 3  # positions 0..5 left the window: their pages' last binding
    (b,) = held(mem, 4)
    assert set(b.pages) <= set(released)  # b took ids the pool got back from a
    assert mem.verify([a, b]) == []
    if end == "finish":
        mem.finish(a, 1.0)
    else:
        mem.retract(a, 1.0)
    assert mem.verify([b]) == []
    assert sorted(mem.pool.live_ids().tolist()) == sorted(b.pages)
    mem.finish(b, 2.0)
    assert mem.verify([]) == [] and len(mem.pool.live_ids()) == 0


def test_window_only_cached_prefixes_hold_only_the_pages_still_bound():
    mem = window_only_memory(block=2)
    (a,) = held(mem, 8)
    a.hashes = (1, 2, 3, 4)
    mem.ratchet([a])  # the first two pages leave the window: the pool takes them back
    mem.finish(a, 1.0)  # four cached blocks, the first two holding nothing
    assert mem.verify([]) == []
    c = Request(1, 2.0, 9, 1, (1, 2, 3, 4))
    mem.take_hit(c, 2.0)  # the last window before the cut is still bound: a hit
    assert c.hit_tokens == 8 and mem.extend(c, 1)
    assert mem.verify([c]) == []
    mem.finish(c, 3.0)
    while mem.evict_some():
        assert mem.verify([]) == []
    assert len(mem.pool.live_ids()) == 0 and mem.pool.verify() == []
