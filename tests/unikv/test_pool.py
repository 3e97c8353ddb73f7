"""UnifiedPool's public surface: ids, paged allocs, errors, views."""

import numpy as np
import pytest
import torch
from factories import fill, full_swa, mamba_full, one_band, pool, same, snapshot, three_band

from unikv import Band, Layout, UnifiedPool
from unikv.backends import SimBackend, SimEvent


def test_alloc_returns_page_structured_token_ids():
    p = pool(one_band("up", page_size=4, total=4000), "lazy")
    v = p.alloc(8)
    assert v.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert p.translate(v, "full").tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # pages 1, 2
    assert p.alloc(0).numel() == 0


def test_virtual_id_returns_only_when_no_band_binds_it():
    p = pool(full_swa(), "lazy")
    v = p.alloc(3)
    free_before = p.vids.free_count
    p.release(v[:1], "swa")
    assert p.vids.free_count == free_before  # still bound on full
    p.release(v[:1], "full")
    assert p.vids.free_count == free_before + 1
    assert p.translate(v[:1], "full").tolist() == [0]
    p.free(v[1:])
    assert p.vids.free_count == free_before + 3
    assert p.verify() == []


def test_release_filters_tombstones_and_the_sink_and_is_idempotent():
    p = pool(full_swa(page_size=2), "lazy")
    v = p.alloc(6)  # pages 1, 2, 3 -> tokens 2..7
    p.release(v[:2], "swa")
    moves = p.stats()["freed_pages"]
    p.release(torch.tensor([0, 1, 2, 3]), "swa")  # sink page 0 + already released page 1
    assert p.stats()["freed_pages"] == moves
    assert p.verify() == []


def test_release_with_start_pos_uses_page_representatives():
    p = pool(full_swa(page_size=4, total=40_000), "lazy")
    v = p.alloc(12)  # pages 1..3 -> tokens 4..15
    p.release(v[3:9], "swa", start_pos=3)  # positions 3..8 -> pages of 3, 4..7, 8
    swa = p.bands["swa"]
    assert (swa.v2p[[1, 2, 3]] >= 0).tolist() == [False, False, False]
    assert p.verify() == []


def test_paged_extend_and_decode_reuse_the_tail_page():
    p = pool(one_band("down", page_size=4, total=4000), "lazy")
    out = p.alloc_extend([0], [6], [-1], 6)
    assert out.tolist() == [4, 5, 6, 7, 8, 9]  # pages 1, 2
    out = p.alloc_extend([6], [9], [9])
    assert out.tolist() == [10, 11, 12]  # tail of page 2, then page 3
    out = p.alloc_decode([10], [12])
    assert out.tolist() == [13]
    assert p.stats()["allocated_pages"] == 3


def test_paged_extend_batch_consumes_new_pages_in_batch_order():
    p = pool(one_band("down", page_size=4, total=4000), "lazy")
    a = p.alloc(4)  # page 1: tokens 4..7
    out = p.alloc_extend([0, 2], [3, 7], [-1, a[1]], 8)
    # req 0: page 2 -> 8, 9, 10; req 1: tail 6, 7 then page 3 -> 12, 13, 14
    assert out.tolist() == [8, 9, 10, 6, 7, 12, 13, 14]
    out = p.alloc_decode([4, 8], [10, 14])
    assert out.tolist() == [11, 15]  # both in their tail pages: no new page
    out = p.alloc_decode([5, 9], [11, 15])
    assert out.tolist() == [16, 20]


def test_state_surface():
    p = pool(mamba_full(), "lazy")
    s = p.alloc_state("mamba", 2)
    assert s.tolist() == [1, 2] and p.translate(s, "mamba").tolist() == [1, 2]
    assert p.available_state("mamba") == 7
    p.free_state("mamba", s[:1])
    assert p.translate(s, "mamba").tolist() == [0, 2]
    assert p.alloc_state("mamba", 0).numel() == 0
    assert p.verify() == []


def test_translate_kernel_ids_scale_by_blocks_per_page():
    layout = Layout(total_bytes=100_000, bands=[
        Band("full", entry_bytes=100, grow="up", page_size=4, blocks_per_page=6)])
    p = UnifiedPool(layout)
    v = p.alloc(8)  # physical pages 1, 2
    assert p.translate(v, "full", kernel=True).tolist() == [24, 25, 26, 27, 48, 49, 50, 51]


def test_buffer_view_is_a_strided_view_of_one_buffer():
    p = pool(three_band())
    view = p.buffer_view("swa")
    assert view.shape == (100, 100) and view.dtype == torch.uint8
    view[10, 0] = 7
    assert p.buffer[1000] == 7
    with pytest.raises(ValueError, match="materialize=True"):
        UnifiedPool(three_band()).buffer_view("swa")


def test_occupancy_bytes_add_up():
    p = pool(three_band(), "lazy")
    v = p.alloc(10)
    p.alloc_state("mamba", 2)
    p.release(v[3:5], "swa")
    occ = p.occupancy()
    swa = occ["bands"]["swa"]
    assert (swa["low_byte"], swa["high_byte"], swa["hole_bytes"]) == (4000, 5000, 200)
    assert occ["free_bytes"] == 10_000 - 1000 - (2000 + 800 + 2000)
    assert occ["gap_bytes"] == (4000 - 3000) + (8000 - 5000)


def test_freeing_everything_returns_the_cleared_state():
    for layout in (full_swa(page_size=2), three_band(), mamba_full()):
        for mode in ("eager", "lazy"):
            p = pool(layout, mode)
            fresh = pool(layout, mode)
            v = p.alloc(8)
            s = p.alloc_state("mamba", 2) if "mamba" in p.bands else None
            if "swa" in p.bands:
                p.release(v[:4], "swa")
            p.free(v)
            if s is not None:
                p.free_state("mamba", s)
            assert p.occupancy() == fresh.occupancy()
            assert p.available_size() == fresh.available_size()
            for name in p.bands:
                assert (p.bands[name].v2p == fresh.bands[name].v2p).all()
            assert sorted(p.vids.free.tolist()) == sorted(fresh.vids.free.tolist())
            assert p.verify() == []


def test_clear_resets_but_keeps_counters():
    p = pool(three_band())
    p.alloc(8)
    p.clear()
    assert p.occupancy() == pool(three_band()).occupancy()
    assert p.stats()["allocated_pages"] == 16


# -- bad input: a clear error, state unchanged --

BAD_CALLS = [
    (lambda p, v: p.alloc(3), "multiple of page_size=2"),
    (lambda p, v: p.alloc(-2), ">= 0"),
    (lambda p, v: p.alloc(2.0), "must be an integer"),
    (lambda p, v: p.free(torch.tensor([10**9])), "outside"),
    (lambda p, v: p.free(torch.tensor([40])), "not allocated"),
    (lambda p, v: p.free(torch.tensor([1.5])), "not an integer dtype"),
    (lambda p, v: p.free(torch.zeros(2, 2, dtype=torch.long)), "not 1-D"),
    (lambda p, v: p.release(v, "mamba"), "request \\(state\\) band"),
    (lambda p, v: p.release(v, "nope"), "unknown band 'nope'"),
    (lambda p, v: p.release(torch.tensor([60]), "swa"), "not allocated"),
    (lambda p, v: p.alloc_state("swa", 1), "token band"),
    (lambda p, v: p.free_state("mamba", [1, 1]), "repeat"),
    (lambda p, v: p.free_state("mamba", [3]), "not allocated"),
    (lambda p, v: p.free_state("mamba", [0]), "outside"),
    (lambda p, v: p.translate([10**9], "full"), "outside"),
    (lambda p, v: p.alloc_extend([0], [4, 4], [0]), "lengths"),
    (lambda p, v: p.alloc_extend([4], [2], [0]), "below prefix_lens"),
    (lambda p, v: p.alloc_extend([0], [4], [0], 5), "extend_num_tokens=5"),
    (lambda p, v: p.alloc_extend([3], [4], [v[1]]), "last position"),
    (lambda p, v: p.alloc_extend([3], [4], [50]), "not on allocated pages"),
    (lambda p, v: p.alloc_decode([0], [0]), ">= 1"),
    (lambda p, v: p.make_room("left", 10), "'low' or 'high'"),
    # Issue 14 item 11: preconditions that used to pass silently.
    (lambda p, v: p.release([v[0], v[3]], "swa", start_pos=0), "not one contiguous run from start_pos=0"),
    (lambda p, v: p.release(v[1:], "swa", start_pos=0), "index 0 is not position 0's slot"),
    (lambda p, v: p.set_inflight_forward(None, v[:2]), "done_event=None but the forward writes 2 ids"),
    (lambda p, v: p.set_inflight_forward(None, None, {"mamba": [1]}), "done_event=None"),
    (lambda p, v: p.set_inflight_forward(SimEvent(), [10**9]), "write_ids: ids \\[1000000000\\] are outside"),
    (lambda p, v: p.set_inflight_forward(SimEvent(), v[:2], {"mamba": [10**6]}), "state ids of 'mamba'.*outside"),
    (lambda p, v: p.flush(urgent="yes"), "urgent='yes' must be a bool"),
    (lambda p, v: UnifiedPool(three_band(), compaction="sometimes"), "'lazy' or 'eager'"),
]


@pytest.mark.parametrize("call, needle", BAD_CALLS)
def test_bad_input_raises_and_leaves_state_unchanged(call, needle):
    p = pool(three_band(page_size=2), "lazy")
    v = p.alloc(8)
    p.alloc_state("mamba", 2)
    p.free(v[6:])
    fill(p, v[:6], "swa", 9)
    v = v[:6]
    p.set_inflight_forward(SimEvent(), v[4:], {"mamba": [1]})  # a forward in flight: kept as it is
    before = snapshot(p)
    with pytest.raises(ValueError, match=needle):
        call(p, v)
    assert same(before, snapshot(p))
    assert p.verify() == []


def test_double_free_is_rejected():
    p = pool(three_band(), "eager")
    v = p.alloc(4)
    p.free(v)
    with pytest.raises(ValueError, match="already freed"):
        p.free(v)


def test_no_token_band_layout():
    layout = Layout(total_bytes=10_000, bands=[Band("mamba", entry_bytes=1000, grow="up", unit="request")])
    p = UnifiedPool(layout)
    assert p.available_size() == 0
    with pytest.raises(ValueError, match="no token band"):
        p.alloc(1)
    assert p.alloc_state("mamba", 9) is not None and p.alloc_state("mamba", 1) is None


def test_set_inflight_forward_checks_its_arguments():
    p = pool(three_band())
    with pytest.raises(ValueError, match="token band"):
        p.set_inflight_forward(SimEvent(), state_write_ids={"swa": [1]})
    assert SimBackend().event_done(SimEvent()) is False


def test_empty_lists_are_valid_no_ops():
    p = pool(three_band(), "lazy")
    before = snapshot(p)
    assert p.free([]) == 0 and p.release([], "swa") == 0 and p.free_state("mamba", []) == 0
    assert p.alloc_decode([], []).numel() == 0
    assert p.alloc_extend([], [], []).numel() == 0
    assert same(before, snapshot(p))


def test_id_space_refuses_more_ids_than_it_has():
    from unikv.ids import IdSpace

    space = IdSpace(4, 1)  # ids 1..3
    with pytest.raises(RuntimeError, match="internal"):
        space.take(4)
    assert space.free_count == 3


@pytest.mark.parametrize("kind", ["unified", "static", "oracle"])
@pytest.mark.parametrize("chain", ["full|swa", "mamba|swa|full"])
def test_usage_agrees_with_occupancy_on_random_states(kind, chain):
    """`usage()` (the simulator's per-step view) reports exactly what
    `occupancy()` does, in chain order, through a random op mix."""
    import random

    from unikv import OraclePool, StaticPartitionPool
    from unikv.testing import Driver, make_layout

    layout = make_layout(chain, 2, 300)
    # ids="torch": the harness (unikv.testing) reads ids and bytes as tensors.
    p = {"unified": lambda: UnifiedPool(layout, backend=SimBackend(materialize=True), ids="torch"),
         "static": lambda: StaticPartitionPool(layout, backend=SimBackend(materialize=True), ids="torch"),
         "oracle": lambda: OraclePool(layout, ids="torch")}[kind]()
    driver = Driver(p, random.Random(5), check_overlap=kind != "oracle")
    keys = ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes", "low_byte", "high_byte")
    for _ in range(300):
        driver.step()
        occ = p.occupancy()
        free, gap, bands = p.usage()
        assert (free, gap) == (occ["free_bytes"], occ["gap_bytes"])
        assert bands == tuple(tuple(occ["bands"][n][k] for k in keys) for n in layout.names)


def test_distinct_pages_equal_numpy_unique_on_every_path():
    """The pool's dedupe (a sort below 2,048 ids, a presence mask above)."""
    from unikv.paged import distinct

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 17, 300, 2047, 2048, 5000):
        for high in (3, 50, 9000):
            pages = rng.integers(0, high, n).astype(np.int64)
            assert distinct(pages, 9000).tolist() == np.unique(pages).tolist(), (n, high)


@pytest.mark.parametrize("chain", ["full|swa", "mamba|swa|full"])
def test_few_id_paths_leave_the_same_pool_as_the_vector_paths(chain, monkeypatch):
    """Unbinding and dropping a few ids per-id (Python) or vectorised
    (numpy) gives identical tables, bind counts and free-id stacks."""
    import random

    import unikv.bands.base as base_mod
    import unikv.ids as ids_mod
    from unikv.testing import Driver, make_layout

    def run(small: int):
        monkeypatch.setattr(ids_mod, "SMALL", small)
        monkeypatch.setattr(base_mod, "SMALL", small)
        p = UnifiedPool(make_layout(chain, 2, 300), backend=SimBackend(materialize=True), ids="torch")
        driver = Driver(p, random.Random(3))  # the harness reads tensors
        states = []
        for _ in range(300):
            driver.step()
            states.append((p.tables.host.tobytes(), p.vids.binds.tobytes(), p.vids.free.tobytes()))
        return states

    assert run(4) == run(0)


@pytest.mark.parametrize("kind,layout", [("unified", full_swa), ("unified", three_band),
                                         ("static", full_swa), ("static", three_band)])
def test_a_take_the_holes_cover_matches_the_chain_plan(kind, layout, monkeypatch):
    """When every token band has the holes an alloc needs, the pool drains
    them without planning (`take_holes`): the same pages and the same
    extents as the chain arithmetic's plan (`take_all` + `adopt`)."""
    from unikv.extent import take_all

    p = pool(layout(), "lazy", kind)
    v = p.alloc(8)
    w = p.alloc(4)
    assert v is not None and w is not None
    p.free(v[1:7])  # 6 holes on every token band, none at a frontier for END bands
    order, bands = p.token_order, p.chain.bands
    for n in (2, 3):  # drain-only, twice
        before = [bands[i].holes[:n].tolist() for i in order]
        plan = take_all(p.chain.extents(), order, n, p.chain.total_bytes)
        ids = p.alloc(n)
        assert [p.translate(ids, bands[i].name).tolist() for i in order] == before
        assert [p.chain.extents()[i] for i in order] == [plan[i] for i in order]
    assert p.verify() == []


@pytest.mark.parametrize("kind,layout", [("unified", full_swa), ("unified", three_band),
                                         ("static", full_swa), ("static", three_band)])
def test_a_take_some_holes_cover_matches_the_chain_plan(kind, layout):
    """Holes on the window band only: it drains them while the full band
    extends; pages and extents are the whole chain's plan."""
    from unikv.extent import take_all

    p = pool(layout(), "lazy", kind)
    v = p.alloc(8)
    assert v is not None
    p.release(v[1:7], "swa")  # 6 holes on swa, none on full
    order, bands = p.token_order, p.chain.bands
    swa = next(i for i in order if bands[i].name == "swa")
    for n in (2, 3):
        want_swa = bands[swa].holes[:n].tolist()
        plan = take_all(p.chain.extents(), order, n, p.chain.total_bytes)
        ids = p.alloc(n)
        assert p.translate(ids, "swa").tolist() == want_swa
        assert [p.chain.extents()[i] for i in order] == [plan[i] for i in order]
    assert p.verify() == []


@pytest.mark.parametrize("kind", ["unified", "static", "oracle"])
def test_numpy_ids_pool_answers_like_the_torch_one(kind):
    """`ids="numpy"` changes only the wrapper: the same ids, as int64 arrays."""
    from unikv import OraclePool, StaticPartitionPool

    cls = {"unified": UnifiedPool, "static": StaticPartitionPool, "oracle": OraclePool}[kind]
    pools = [cls(three_band(page_size=2, total=40_000), SimBackend(), ids=i) for i in ("torch", "numpy")]
    answers = []
    for p in pools:
        out = [p.alloc(8), p.alloc_extend([0], [5], [-1], 5), p.alloc_state("mamba", 2)]
        out.append(p.alloc_decode([9], [int(out[0][-1])]))
        answers.append(out)
    for t, n in zip(*answers):
        assert isinstance(t, torch.Tensor) and isinstance(n, np.ndarray) and n.dtype == np.int64
        assert t.tolist() == n.tolist()
    assert pools[0].occupancy() == pools[1].occupancy()


def test_ids_option_is_checked():
    with pytest.raises(ValueError, match="ids='list' must be 'torch', 'numpy' or None"):
        UnifiedPool(three_band(), ids="list")


@pytest.mark.parametrize("kind", ["unified", "static", "oracle"])
@pytest.mark.parametrize("chain", ["full|swa", "mamba|swa|full"])
def test_available_size_floor_bounds_the_schedulable_view(kind, chain):
    """`available_size_floor()` (the flushed view, no float slide) never
    exceeds `available_size(schedulable=True)`, equals it on a chain
    without a float, and falls short of it somewhere on the float chain
    (the slide's room), through a random op mix."""
    import random

    from unikv import OraclePool, StaticPartitionPool
    from unikv.testing import Driver, make_layout

    layout = make_layout(chain, 2, 300)
    p = {"unified": lambda: UnifiedPool(layout, backend=SimBackend(materialize=True), ids="torch"),
         "static": lambda: StaticPartitionPool(layout, backend=SimBackend(materialize=True), ids="torch"),
         "oracle": lambda: OraclePool(layout, ids="torch")}[kind]()
    driver = Driver(p, random.Random(9), check_overlap=kind != "oracle")
    below = 0
    for _ in range(400):
        driver.step()
        floor, full = p.available_size_floor(), p.available_size(schedulable=True)
        assert floor <= full
        below += floor < full
        if chain == "full|swa" or kind != "unified":
            assert floor == full
    assert below > 0 or chain == "full|swa" or kind != "unified"
    assert p.verify() == []
