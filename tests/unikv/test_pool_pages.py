"""The page-level pool surface (take_pages, release_pages, free_pages,
set_inflight_pages): the same pool state as the token-id calls it stands
for, and bad pages refused with the state unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unikv.factories import full_swa, pool, same, snapshot
from unikv.backends.sim import SimEvent


def twin_pools(kind: str = "unified", ps: int = 4):
    """Two equal pools with a few pages allocated, some freed (holes)."""
    out = []
    for _ in range(2):
        p = pool(full_swa(page_size=ps, total=100_000), kind=kind, ids="numpy")
        ids = p.alloc(8 * ps)
        p.free(ids[2 * ps: 4 * ps])  # two pages freed: holes on both lazy bands
        out.append(p)
    return out


@pytest.mark.parametrize("kind", ["unified", "static", "oracle"])
def test_take_pages_equals_a_decode_of_openers(kind):
    a, b = twin_pools(kind)
    ps = a.page_size
    fresh = a.take_pages(3)
    ids = b.alloc_decode(np.ones(3, dtype=np.int64), np.full(3, -1, dtype=np.int64))  # each opens a page
    assert fresh.tolist() == [t // ps for t in ids.tolist()]
    assert same(snapshot(a), snapshot(b))
    assert a.take_pages(0).tolist() == []


def test_take_pages_takes_what_alloc_takes():
    a, b = twin_pools()
    ps = a.page_size
    fresh = a.take_pages(3)
    ids = b.alloc(3 * ps)
    assert fresh.tolist() == (ids[::ps] // ps).tolist()
    assert same(snapshot(a), snapshot(b))


def test_release_pages_equals_release_of_their_ids():
    a, b = twin_pools()
    ps = a.page_size
    pages = [7, 5, 0]  # unsorted, with the sink (skipped, as release skips it)
    assert a.release_pages(pages, "swa") == b.release(np.array([p * ps for p in pages]), "swa")
    assert same(snapshot(a), snapshot(b))
    assert a.release_pages([5], "swa") == 0  # already released there: skipped
    assert same(snapshot(a), snapshot(b))


def test_free_pages_equals_free_of_their_ids():
    a, b = twin_pools()
    ps = a.page_size
    a.release_pages([6], "swa")
    b.release(np.array([6 * ps]), "swa")
    a.free_pages([8, 6, 1])
    b.free(np.array([8 * ps, 6 * ps, 1 * ps]))
    assert same(snapshot(a), snapshot(b))


def test_many_pages_take_the_vector_path_with_the_same_result():
    a, b = twin_pools(ps=1)
    more = a.take_pages(20).tolist()
    b.alloc(20)
    assert a.release_pages(more, "swa") == b.release(np.array(more), "swa")
    assert same(snapshot(a), snapshot(b))


def test_a_batch_of_pages_takes_the_python_int_path_with_the_same_result():
    """Between `ids.SMALL` and `paged.SMALL_BATCH` pages (checked on Python
    ints), all bound or some released already: as the token-id call."""
    a, b = twin_pools(ps=1)
    more = a.take_pages(12).tolist()
    b.alloc(12)
    batch = more[::-1][:10] + [0]  # unsorted, with the sink
    assert a.release_pages(batch, "swa") == b.release(np.array(batch), "swa")
    assert same(snapshot(a), snapshot(b))
    assert a.release_pages(more, "swa") == b.release(np.array(more), "swa")  # 10 of 12 released there
    assert same(snapshot(a), snapshot(b))


@pytest.mark.parametrize("call, message", [
    (lambda p: p.release_pages([3, 3], "swa"), "release_pages: pages \\[3\\] repeat"),
    (lambda p: p.release_pages([1, 2, 5, 6, 7, 7], "swa"), "release_pages: pages \\[7\\] repeat"),
    (lambda p: p.release_pages([1, 2, 5, 6, 7, 3], "swa"), "release_pages: virtual pages \\[3\\] are not"),
    (lambda p: p.release_pages([1, 2, 5, 6, 7, 10**6], "swa"), "release_pages: pages \\[1000000\\] are outside"),
    (lambda p: p.free_pages([-1, 1, 2, 5, 6, 7]), "free_pages: pages \\[-1\\] are outside"),
    (lambda p: p.release_pages([4], "swa"), "release_pages: virtual pages \\[4\\] are not allocated"),
    (lambda p: p.release_pages([10**6], "swa"), "release_pages: pages \\[1000000\\] are outside"),
    (lambda p: p.release_pages([1], "nope"), "unknown band 'nope'"),
    (lambda p: p.free_pages([0]), "free_pages: virtual pages \\[0\\] are not allocated"),
    (lambda p: p.free_pages([-1]), "free_pages: pages \\[-1\\] are outside"),
    (lambda p: p.take_pages(-1), "take_pages: n=-1 must be >= 0"),
    (lambda p: p.set_inflight_pages(SimEvent(), [10**6]), "set_inflight_pages: pages: ids \\[1000000\\] are outside"),
    (lambda p: p.set_inflight_pages(None, [1]), "done_event=None but the forward writes 1 ids"),
])
def test_bad_pages_are_refused_and_leave_the_pool_unchanged(call, message):
    p, _ = twin_pools()
    before = snapshot(p)
    with pytest.raises(ValueError, match=message):
        call(p)
    assert same(snapshot(p), before)


def test_set_inflight_pages_declares_the_same_forward_as_its_ids():
    a, b = twin_pools()
    ps = a.page_size
    ev_a, ev_b = SimEvent(), SimEvent()
    a.set_inflight_pages(ev_a, [8, 7, 8])
    b.set_inflight_forward(ev_b, np.array([8 * ps + 1, 7 * ps, 8 * ps + 2]))
    assert a.hazards.writes_of("full") == b.hazards.writes_of("full") == {7, 8}
    assert {k: v.tolist() for k, v in a.hazards.writes.items()} == \
        {k: v.tolist() for k, v in b.hazards.writes.items()}
    assert a.flush() == b.flush()  # the same pages are protected from moves
    sa, sb = snapshot(a), snapshot(b)
    assert sa.pop("forward")[1] == sb.pop("forward")[1]  # (the events differ: two pools)
    assert same(sa, sb)


def test_set_inflight_pages_takes_state_slots_as_ints():
    """State slots given as Python ints declare the forward an int64 array
    declares (the mamba band's flush protects the same slots); bad slots
    are refused naming the band, with the pool unchanged."""
    from tests.unikv.factories import mamba_full

    pools = []
    for _ in range(2):
        p = pool(mamba_full(page_size=4, total=100_000), ids="numpy")
        slots = p.alloc_state("mamba", 6)
        p.free_state("mamba", slots[1:3])  # holes below the mamba frontier
        p.alloc(8)
        pools.append((p, slots))
    (a, slots), (b, _) = pools
    live = [int(s) for s in slots[3:]] + [int(slots[0])]
    a.set_inflight_pages(SimEvent(), [1, 2], {"mamba": live})
    b.set_inflight_pages(SimEvent(), [1, 2], {"mamba": np.array(live, dtype=np.int64)})
    assert a.hazards.writes_of("mamba") == b.hazards.writes_of("mamba") == set(live)
    assert a.hazards.writes_page("mamba", live[0]) and not a.hazards.writes_page("mamba", live[0] + 100)
    assert a.flush() == b.flush() == 0  # the frontier slot is written: nothing moves on either
    assert {k: v.tolist() for k, v in a.hazards.writes.items()} == \
        {k: v.tolist() for k, v in b.hazards.writes.items()}
    before = snapshot(a)
    for states, message in (({"mamba": [10**6]}, "state ids of 'mamba': ids \\[1000000\\] are outside"),
                            ({"mamba": [-1]}, "state ids of 'mamba': ids \\[-1\\] are outside"),
                            ({"full": [1]}, "band 'full' is a token band"),
                            ({"nope": [1]}, "unknown band 'nope'")):
        with pytest.raises(ValueError, match=message):
            a.set_inflight_pages(SimEvent(), [1], states)
        assert same(snapshot(a), before)
    with pytest.raises(ValueError, match="done_event=None but the forward writes 2 ids"):
        a.set_inflight_pages(None, [], {"mamba": live[:2]})
    assert same(snapshot(a), before)
