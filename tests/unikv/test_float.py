"""The FLOAT band on the 3-band layout mamba(up) | swa(float) | full(down).

Grids (page_size 1): mamba pages 1..9 (1000 B), swa 10..99 (100 B),
full 5..49 (200 B); buffer 10,000 B, sink 1,000 B.
"""

import random

import pytest
import torch
from factories import fill, pool, read, three_band

import unikv.bands.float
from unikv import Side


@pytest.fixture
def p():
    p = pool(three_band(), "lazy")
    v = p.alloc(10)
    p.v = v
    p.data = fill(p, v, "swa", 7)
    return p


def span(p):
    b = p.bands["swa"]
    return b.low, b.high


def test_float_centres_in_the_free_region_from_empty(p):
    # full took [40, 50) -> its low byte 8000 = swa page 80; region [10, 80)
    assert span(p) == (40, 50)
    assert p.translate(p.v, "swa").tolist() == list(range(40, 50))
    assert p.translate(p.v, "full").tolist() == list(range(40, 50))
    assert p.available_size() == 15  # full reaches swa's high byte 5000 = page 25
    assert p.available_state("mamba") == 3  # swa low byte 4000 -> mamba pages 1..3


def test_float_extends_toward_the_roomier_gap(p):
    w = p.alloc(5)  # full [35, 40); swa gaps: low 30, high 70-50=20 -> low
    assert span(p) == (35, 50)
    assert p.translate(w, "swa").tolist() == [35, 36, 37, 38, 39]


def test_release_marks_holes_reused_first_and_absorbed_at_flush(p):
    p.release(p.v[[0, 5]], "swa")  # holes at 40 (boundary) and 45
    assert span(p) == (40, 50) and p.bands["swa"].live == 8
    w = p.alloc(1)
    assert p.translate(w, "swa").item() in (40, 45)
    p.release(w, "swa")
    p.flush()
    assert span(p) == (41, 50)  # boundary hole absorbed, 45 stays interior
    assert p.bands["swa"].holes.tolist() == [45]
    assert p.verify() == []


def test_empty_float_parks_and_turns_transparent(p):
    p.release(p.v, "swa")
    occ = p.occupancy()["bands"]["swa"]
    assert occ["transparent"] and occ["occupied_bytes"] == 0
    assert p.translate(p.v, "swa").tolist() == [0] * 10  # tombstones -> sink
    assert p.available_state("mamba") == 7  # now up to full's low byte 8000


def test_make_room_moves_the_fewest_boundary_pages(p):
    assert p.bands["swa"].gap_bytes(Side.HIGH, p.chain.extents()) == 3000
    opened = p.make_room("high", 3500)  # need 5 more pages on the high side
    assert opened == 3500
    assert span(p) == (35, 45)
    assert p.translate(p.v[5:], "swa").tolist() == [35, 36, 37, 38, 39]  # 49->39 ... 45->35
    assert torch.equal(read(p, p.v, "swa"), p.data)
    assert p.stats()["moves"] == 5 and p.stats()["relocations"] == 1
    assert p.verify() == []


def test_make_room_leapfrogs_when_it_would_move_every_page(p):
    assert p.make_room("low", 6000) == 6000  # needs 30 pages: > 10 live
    assert span(p) == (70, 80)  # packed against the region's high edge
    assert torch.equal(read(p, p.v, "swa"), p.data)
    assert p.verify() == []


def test_make_room_impossible_leaves_state_unchanged(p):
    before = p.translate(p.v, "swa").clone()
    assert p.make_room("low", 6100) == 3000  # region 70 pages - 10 live = 6000 B max
    assert torch.equal(p.translate(p.v, "swa"), before) and p.stats()["moves"] == 0


def test_compact_holes_closes_every_hole_in_order(p):
    p.release(p.v[[2, 7]], "swa")  # holes 42, 47
    assert p.compact_holes("high") == 6  # 43..46 -> 42..45, 48, 49 -> 46, 47
    assert span(p) == (40, 48)
    keep = [0, 1, 3, 4, 5, 6, 8, 9]
    assert p.translate(p.v[keep], "swa").tolist() == list(range(40, 48))
    assert torch.equal(read(p, p.v[keep], "swa"), p.data[keep])
    assert p.verify() == []


def test_relocation_settles_the_in_flight_forward(p):
    from unikv.backends import SimEvent

    ev = SimEvent()
    p.set_inflight_forward(ev, write_ids=p.v)
    p.make_room("high", 3500)
    assert ev.fired


def test_make_room_leapfrogs_no_further_than_needed(p):
    # 4000 B low = 40 pages > 10 live, so every page moves; the span lands
    # at [50, 60), leaving the high side 20 pages, not against full's frontier
    assert p.make_room("low", 4000) == 4000
    assert span(p) == (50, 60)
    assert torch.equal(read(p, p.v, "swa"), p.data)
    assert p.available_size() == 10  # full reaches swa's high byte 6000


def test_make_room_keeps_the_far_sides_holes(p):
    p.release(p.v[[0, 9]], "swa")  # holes 40 and 49, both on a boundary
    assert p.make_room("high", 3100) == 3100  # only the high hole is dropped
    assert span(p) == (40, 49) and p.bands["swa"].holes.tolist() == [40]
    assert p.stats()["moves"] == 0 and p.verify() == []


def test_hole_list_is_the_frees_in_order_less_the_takes(p, monkeypatch):
    """Frees append to the hole list and allocs drain its front: the list
    lives in a store that grows when full (`FloatBand._appended`; a small
    first store here, so it grows often), and after a flush it starts over
    from the new list."""
    monkeypatch.setattr(unikv.bands.float, "FIRST_STORE", 8)
    b, rng = p.bands["swa"], random.Random(0)
    live, released, model, ends = p.v.tolist(), [], b.holes.tolist(), set()
    for _ in range(1500):
        ladder = p.counters.ladder_runs
        new = p.alloc(rng.randint(1, 3)).tolist()
        del model[:len(new)]
        if p.counters.ladder_runs != ladder:  # the shortfall ladder flushed: the list starts over
            model = b.holes.tolist()
        live += new
        gone = sorted(rng.sample(live, min(len(live) - 4, rng.randint(1, 3) + 2 * (len(live) > 12))))
        model += [int(b.v2p[v]) for v in gone]  # unbound in ascending virtual order
        p.release(torch.tensor(gone), "swa")
        live = [v for v in live if v not in gone]
        released += gone
        assert b.holes.tolist() == model
        ends.add(b._end)
        if len(released) > 4:  # the full band lets them go too: its pages come back
            p.free(torch.tensor(released))
            released = []
        if rng.random() < 0.002:
            p.flush()
            model = b.holes.tolist()
    assert max(ends) > 16 and p.verify() == []


def test_absorb_span_is_the_span_plan_absorb_leaves(p):
    """`absorb_span` (read from p2v) gives the span and hole count of the
    plan `plan_absorb` builds from the sorted hole list, through random
    frees and takes that leave runs of holes on either boundary, long and
    short; the pool's flush then applies the plan or refuses it."""
    b, rng = p.bands["swa"], random.Random(1)
    live, released, seen = p.v.tolist(), [], {"low": 0, "high": 0, "none": 0}
    for _ in range(600):
        live += p.alloc(rng.randint(1, 3)).tolist()
        edge = sorted(live, key=lambda v: int(b.v2p[v]))  # by physical page, low first
        pick = edge[:rng.randint(0, 3)] + edge[len(edge) - rng.randint(0, 3):] + rng.sample(live, 1)
        gone = sorted(set(pick))[: max(0, len(live) - 4)]
        p.release(torch.tensor(gone), "swa")
        live = [v for v in live if v not in gone]
        released += gone
        plan = b.plan_absorb()
        got = b.absorb_span()
        assert got == (None if plan is None else (plan.low, plan.high, len(plan.holes)))
        if plan is None:
            seen["none"] += 1
        else:
            seen["low"] += plan.low > b.low
            seen["high"] += plan.high < b.high
            seen["long"] = seen.get("long", 0) + (max(plan.low - b.low, b.high - plan.high) > 2)
        if len(released) > 6:
            p.free(torch.tensor(released))
            released = []
        if rng.random() < 0.1:
            p.flush()
    assert min(seen["low"], seen["high"], seen["none"]) > 10 and p.verify() == []
    assert seen["long"] > 10  # runs of three holes or more
