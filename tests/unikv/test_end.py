"""END bands: watermarks, eager compaction, lazy holes / flush / hazards."""

import pytest
import torch
from factories import fill, full_swa, one_band, pool, read

from unikv.backends import SimEvent


def wm(p, band="full"):
    return p.bands[band].watermark


def test_up_alloc_is_contiguous_from_the_sink():
    p = pool(one_band("up"), "eager")
    v = p.alloc(3)
    assert v.tolist() == [1, 2, 3]
    assert p.translate(v, "full").tolist() == [1, 2, 3]
    assert wm(p) == 4


def test_down_alloc_grows_from_the_top():
    p = pool(one_band("down"), "eager")
    v = p.alloc(3)
    assert p.translate(v, "full").tolist() == [7, 8, 9]
    assert wm(p) == 7


def test_eager_up_free_moves_the_strip_survivor_into_the_hole():
    p = pool(one_band("up"), "eager")
    v = p.alloc(3)
    data = fill(p, v, "full", 0)
    assert p.free(v[:1]) == 1  # page 3 (vacated strip) moves into page 1
    assert wm(p) == 3
    assert p.translate(v[1:], "full").tolist() == [2, 1]
    assert torch.equal(read(p, v[1:], "full"), data[1:])
    assert p.stats()["moves"] == 1 and p.stats()["moved_bytes"] == 100
    assert p.verify() == []


def test_eager_down_free_moves_the_low_survivor_up():
    p = pool(one_band("down"), "eager")
    v = p.alloc(3)  # phys 7, 8, 9
    data = fill(p, v, "full", 1)
    p.free(v[2:])  # frees page 9; strip [7, 8) -> page 7 moves to 9
    assert wm(p) == 8
    assert p.translate(v[:2], "full").tolist() == [9, 8]
    assert torch.equal(read(p, v[:2], "full"), data[:2])
    assert p.verify() == []


def test_eager_free_of_the_frontier_page_moves_nothing():
    p = pool(one_band("up"), "eager")
    v = p.alloc(3)
    assert p.free(v[2:]) == 0 and wm(p) == 3


def test_lazy_free_leaves_a_hole_that_alloc_reuses():
    p = pool(one_band("up"), "lazy")
    v = p.alloc(3)
    assert p.free(v[:1]) == 0
    assert wm(p) == 4 and p.bands["full"].holes.tolist() == [1]
    assert p.available_size() == 1 + 6
    w = p.alloc(1)
    assert p.translate(w, "full").tolist() == [1] and wm(p) == 4
    assert p.verify() == []


def test_lazy_flush_packs_top_survivor_into_deepest_hole_then_absorbs():
    p = pool(one_band("up"), "lazy")
    v = p.alloc(5)  # phys 1..5
    data = fill(p, v, "full", 2)
    p.free(v[[1, 3]])  # holes at 2 and 4
    assert p.flush() == 1  # 5 -> 2; then 4 and 5 sit at the frontier
    assert wm(p) == 4 and p.bands["full"].holes.size == 0
    keep = v[[0, 2, 4]]
    assert p.translate(keep, "full").tolist() == [1, 3, 2]
    assert torch.equal(read(p, keep, "full"), data[[0, 2, 4]])
    assert p.verify() == []


def test_lazy_free_of_everything_resets_the_frontier():
    p = pool(one_band("down"), "lazy")
    v = p.alloc(4)
    p.free(v)
    assert wm(p) == 10 and p.bands["full"].holes.size == 0


def test_non_urgent_flush_respects_the_move_cap():
    p = pool(one_band("up", total=3000), "lazy", move_cap=2)  # 29 usable pages
    v = p.alloc(10)
    p.free(v[:4])  # holes 1..4, survivors 5..10
    assert p.flush() == 2  # 10 -> 1, 9 -> 2
    assert p.flush() == 2  # 8 -> 3, 7 -> 4
    assert p.flush() == 0 and wm(p) == 7
    assert p.verify() == []


def test_pending_reuse_waits_for_the_reader_event():
    p = pool(one_band("up"), "lazy")
    v = p.alloc(4)  # phys 1..4
    p.free(v[:1])
    ev = SimEvent("fwd")
    p.set_inflight_forward(ev, write_ids=None)
    assert p.flush() == 1  # 4 -> 1, but the forward may still read page 4
    band = p.bands["full"]
    assert band.pending_set == {4} and wm(p) == 5
    assert p.occupancy()["bands"]["full"]["pending_pages"] == 1
    w = p.alloc(1)
    assert p.translate(w, "full").tolist() == [5]  # page 4 is not reused early
    p.free(w)
    ev.fire()
    p.flush()
    assert band.pending_set == set() and wm(p) == 4
    assert p.verify() == []


def test_non_urgent_flush_stops_at_a_page_the_forward_writes():
    p = pool(one_band("up"), "lazy")
    v = p.alloc(4)
    data = fill(p, v, "full", 3)
    p.free(v[:1])
    ev = SimEvent("fwd")
    p.set_inflight_forward(ev, write_ids=v[3:])  # the forward writes page 4
    assert p.flush() == 0 and not ev.fired
    assert p.flush(urgent=True) == 1  # settles the forward, then packs
    assert ev.fired and wm(p) == 4
    assert torch.equal(read(p, v[1:], "full"), data[1:])
    assert p.stats()["settles"] == 1


def test_eager_move_settles_the_in_flight_forward_first():
    p = pool(one_band("up"), "eager")
    v = p.alloc(3)
    ev = SimEvent("fwd")
    p.set_inflight_forward(ev, write_ids=v[2:])
    p.free(v[2:])  # frontier page: no move, no wait
    assert not ev.fired
    p.free(v[:1])  # page 2 moves into page 1: wait for the forward first
    assert ev.fired


def test_urgent_flush_packs_fully_in_one_pass():
    p = pool(full_swa(), "lazy")
    v = p.alloc(10)
    data = fill(p, v, "swa", 4)
    p.release(v[[1, 3, 5, 7]], "swa")  # swa phys 90..99: holes 91, 93, 95, 97
    assert p.flush(urgent=True) == 2  # 90->97, 92->95; then 94 > 93: the walks crossed
    swa = p.bands["swa"]
    assert swa.watermark == 94 and swa.holes.size == 0
    keep = v[[0, 2, 4, 6, 8, 9]]
    assert torch.equal(read(p, keep, "swa"), data[[0, 2, 4, 6, 8, 9]])
    assert p.verify() == []


@pytest.mark.parametrize("vector", [False, True], ids=["walk", "numpy"])
def test_lazy_flush_tells_the_backend_its_moves_are_disjoint(vector, monkeypatch):
    """A pack moves survivors into holes, never onto one of them: the backend
    is told so (no overlap check), and the bytes follow their pages."""
    if vector:
        monkeypatch.setattr("unikv.bands.end.VECTOR_PACK", 1)
    p = pool(one_band("up"), "lazy")
    v = p.alloc(6)  # phys 1..6
    data = fill(p, v, "full", 5)
    p.free(v[:2])
    seen = []
    real = p.backend.move_pages

    def spy(buffer, page_bytes, src, dst, disjoint=None):
        seen.append((src.tolist(), dst.tolist(), disjoint))
        real(buffer, page_bytes, src, dst, disjoint=disjoint)
    monkeypatch.setattr(p.backend, "move_pages", spy)
    assert p.flush() == 2
    assert seen == [([6, 5], [1, 2], True)]
    assert torch.equal(read(p, v[2:], "full"), data[2:]) and wm(p) == 5 and p.verify() == []
