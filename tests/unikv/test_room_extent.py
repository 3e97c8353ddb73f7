"""The float's counted room plans equal the built ones (the capacity search
uses the counts, the ladder applies the plans)."""

import random

import pytest

from unikv.extent import Extent, Kind, relocated, room_extent, room_plan
from unikv.layout import Side


def random_float(rng):
    lo = rng.randrange(0, 40)
    hi = lo + rng.randrange(1, 120)
    low = rng.randrange(lo, hi)
    high = rng.randrange(low + 1, hi + 1)
    span = list(range(low, high))
    holes = rng.sample(span, rng.randrange(0, len(span)))  # at least one live page
    return lo, hi, low, high, holes


@pytest.mark.parametrize("seed", range(6))
def test_room_extent_counts_what_room_plan_builds(seed):
    rng = random.Random(seed)
    for _ in range(3000):
        lo, hi, low, high, holes = random_float(rng)
        side = rng.choice(list(Side))
        need = rng.randrange(0, hi - lo + 3)
        keep = rng.choice([0, rng.randrange(0, hi - lo + 1)])
        rng.shuffle(holes)  # room_plan takes any order; room_extent sorted
        plan = room_plan(low, high, holes, (lo, hi), side, need, keep)
        got = room_extent(low, high, sorted(holes), (lo, hi), side, need, keep)
        if plan is None:
            assert got is None
            continue
        e = Extent(Kind.FLOAT, 64, 0, hi + 5, low, high, len(holes), high - low - len(holes))
        r = relocated(e, plan)
        assert got == (r.low, r.high, r.holes), (lo, hi, low, high, sorted(holes), side, need, keep)


@pytest.mark.parametrize("seed", range(4))
def test_slide_fits_agrees_with_slide_plan_on_churned_pools(seed):
    """On a 3-band pool churned by allocs, window releases and frees, the
    counted slide check and the built slide plan agree for every demand."""
    import numpy as np

    from tests.unikv.factories import pool as make_pool
    from tests.unikv.factories import three_band
    from unikv.extent import demand_fits
    from unikv.policy import slide_plan, slide_request

    rng = random.Random(seed)
    p = make_pool(three_band(page_size=1, total=20_000))
    live = []
    checked = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.5:
            ids = p.alloc(rng.randrange(1, 8))
            if ids is not None:
                live.append(ids.numpy().tolist())
        elif op < 0.75 and live:
            ids = live[rng.randrange(len(live))]
            some = [t for t in ids if p.translate(np.array([t]), "swa")[0] > 0]
            if some:
                p.release(np.array(rng.sample(some, rng.randrange(1, len(some) + 1))), "swa")
        elif live:
            p.free(np.array(live.pop(rng.randrange(len(live)))))
        if rng.random() < 0.1:
            p.flush(urgent=rng.random() < 0.3)
        ext = p.chain.extents(schedulable=True)
        f = p.chain.float_index()
        holes = sorted(p.chain.bands[f].holes.tolist())
        order = p.token_order
        for n in rng.sample(range(0, 200), 6):
            demand = {i: n for i in order}
            request = slide_request(ext, f, holes, demand, p.chain.total_bytes)
            plan = slide_plan(ext, f, p.chain.bands[f].holes, demand, p.chain.total_bytes)
            assert (request is None) == (plan is None)
            if plan is not None:  # the built plan has the counted span, and fits
                trial = list(ext)
                trial[f] = relocated(ext[f], plan)
                assert demand_fits(trial, demand, p.chain.total_bytes)
            checked += 1
    assert checked == 2400


def test_absorb_plan_equals_a_set_walk():
    from unikv.extent import Relocation, absorb_plan

    def walk(low, high, holes):
        free = set(holes)
        while low < high and low in free:
            free.discard(low)
            low += 1
        while high > low and high - 1 in free:
            free.discard(high - 1)
            high -= 1
        return Relocation((), (), low, high, tuple(sorted(free)))

    rng = random.Random(11)
    for _ in range(5000):
        low = rng.randrange(0, 50)
        span = list(range(low, low + rng.randrange(0, 40)))
        holes = set(rng.sample(span, rng.randrange(0, len(span) + 1)))
        if span and rng.random() < 0.5:  # runs on the boundaries
            holes |= set(span[: rng.randrange(len(span))]) | set(span[len(span) - rng.randrange(len(span)):])
        holes = list(holes)
        rng.shuffle(holes)
        high = low + len(span)
        assert absorb_plan(low, high, holes) == walk(low, high, holes), (low, high, holes)
