"""The pure band arithmetic, on hand-built chains."""

from unikv.extent import (
    Extent,
    Kind,
    absorb_plan,
    bound_above,
    bound_below,
    chain_gap_bytes,
    joint_pages,
    room_plan,
    take,
)
from unikv.layout import Side

TOTAL = 10_000


def up(high, holes=0, live=None):
    return Extent(Kind.UP, 1000, 1, 10, 1, high, holes, high - 1 - holes if live is None else live)


def flt(low, high, holes=0):
    return Extent(Kind.FLOAT, 100, 10, 100, low, high, holes, high - low - holes)


def down(low, holes=0):
    return Extent(Kind.DOWN, 200, 5, 50, low, 50, holes, 50 - low - holes)


def test_walks_see_through_a_transparent_float():
    chain = [up(3), flt(0, 0), down(40)]
    assert bound_above(chain, 0, TOTAL) == 8000  # full's low byte, through the float
    assert bound_below(chain, 2) == 3000
    chain = [up(3), flt(40, 50), down(40)]
    assert bound_above(chain, 0, TOTAL) == 4000
    assert bound_below(chain, 2) == 5000


def test_end_takes_holes_first_then_extends():
    chain = [up(3), flt(0, 0), down(40, holes=2)]
    e = take(chain, 2, 5, TOTAL)
    assert (e.low, e.holes, e.live) == (37, 0, 13)
    assert take(chain, 2, 2 + 25, TOTAL).low == 15  # up's frontier: 3000 B = full page 15
    assert take(chain, 2, 2 + 26, TOTAL) is None
    chain = [up(1), flt(0, 0), down(40)]
    assert take(chain, 2, 35, TOTAL).low == 5  # down to full's min_page


def test_float_centres_from_empty_and_extends_toward_roomier_gap():
    chain = [up(1), flt(0, 0), down(50)]
    e = take(chain, 1, 10, TOTAL)
    # region [10, 100): start = 10 + (90 - 10) // 2
    assert (e.low, e.high) == (50, 60)
    chain = [up(1), flt(40, 50), down(40)]  # gaps: low 30 pages, high 80-50=30
    assert (take(chain, 1, 5, TOTAL).low, take(chain, 1, 5, TOTAL).high) == (40, 55)
    chain = [up(1), flt(30, 50), down(40)]  # low 20, high 30 -> high
    assert take(chain, 1, 25, TOTAL).high == 75
    assert take(chain, 1, 31, TOTAL) is None


def test_joint_pages_three_band_hand_computed():
    # empty chain: n tokens cost 300 B of 9000 free -> 30
    assert joint_pages([up(1), flt(0, 0), down(50)], [2, 1], TOTAL) == 30
    # float [40,50), full [40,50): full can only reach swa's high byte 5000 = page 25
    assert joint_pages([up(1), flt(40, 50), down(40)], [2, 1], TOTAL) == 15


def test_gap_bytes():
    assert chain_gap_bytes([up(3), flt(0, 0), down(40)], 1000, TOTAL) == 5000
    assert chain_gap_bytes([up(3), flt(40, 50), down(40)], 1000, TOTAL) == 1000 + 3000
    lone = [Extent(Kind.DOWN, 100, 1, 10, 7, 10, 0, 3)]
    assert chain_gap_bytes(lone, 100, 1000) == 600


def _general_joint_pages(chain, order, total):
    """The monotone search over `take_all` that the closed forms replace."""
    from unikv.extent import extension_room, search, take_all

    hi = min(chain[i].holes + extension_room(chain, i, total) for i in order)
    return search(lambda n: take_all(chain, order, n, total) is not None, hi, 0)


def test_facing_pair_closed_form_equals_the_general_search():
    import random

    from unikv.extent import facing_pair_pages

    rng = random.Random(7)
    for _ in range(3000):
        total = rng.randrange(2_000, 20_000)
        pu, pd = rng.choice([100, 300, 1000, 64, 96]), rng.choice([100, 200, 700, 64, 48])
        nu, nd = total // pu, total // pd
        mu, md = rng.randrange(1, 4), rng.randrange(1, 4)
        if nu <= mu + 1 or nd <= md + 1:
            continue
        high = rng.randrange(mu, nu + 1)
        floor = max(md, -(-high * pu // pd))
        if floor > nd:
            continue
        low = rng.randrange(floor, nd + 1)
        u_holes = rng.randrange(0, high - mu + 1)
        d_holes = rng.randrange(0, nd - low + 1)
        u = Extent(Kind.UP, pu, mu, nu, mu, high, u_holes, high - mu - u_holes)
        d = Extent(Kind.DOWN, pd, md, nd, low, nd, d_holes, nd - low - d_holes)
        middle = [Extent(Kind.FLOAT, 50, 1, total // 50, 0, 0, 0, 0)] * rng.randrange(0, 3)
        chain = [u, *middle, d]
        order = [0, len(chain) - 1]
        expected = _general_joint_pages(chain, order, total)
        assert facing_pair_pages(chain, order) == expected, (chain, expected)
        assert joint_pages(chain, order, total, hint=rng.randrange(0, 50)) == expected
        _assert_column_twins(chain, order, total, expected if not middle else None)
    # other shapes are not its business: the search answers them
    assert facing_pair_pages([up(3), flt(40, 50), down(40)], [0, 2]) is None
    assert facing_pair_pages([up(3), down(40)], [1, 0]) is None
    assert facing_pair_pages([up(3), flt(0, 0), down(40)], [0, 1, 2]) is None


def test_float_pair_closed_form_equals_the_general_search():
    import random

    from unikv.extent import float_pair_pages, joint_fits, take_all

    rng = random.Random(3)
    transparent = 0
    for _ in range(3000):
        total = rng.randrange(2_000, 40_000)
        pu, pf, pd = rng.choice([100, 300, 64, 96]), rng.choice([16, 50, 64, 48, 7]), rng.choice([100, 700, 48, 9])
        mu, mf, md = rng.randrange(1, 4), rng.randrange(1, 4), rng.randrange(1, 4)
        nu, nf, nd = total // pu, total // pf, total // pd
        chain, below = [], 0
        if rng.random() < 0.8:  # an UP band below the float (a state band), or none
            high = rng.randrange(mu, max(mu + 1, nu // 3))
            chain.append(Extent(Kind.UP, pu, mu, nu, mu, high, 0, high - mu))
            below = high * pu
        low = rng.randrange(min(nd, max(md, -(-below // pd))), nd + 1)
        d_holes = rng.randrange(0, nd - low + 1)
        d = Extent(Kind.DOWN, pd, md, nd, low, nd, d_holes, nd - low - d_holes)
        floor, ceiling = max(mf, -(-below // pf)), min(nf, low * pd // pf)
        if rng.random() < 0.3 or ceiling <= floor:
            f = Extent(Kind.FLOAT, pf, mf, nf, 0, 0, 0, 0)
            transparent += 1
        else:
            a = rng.randrange(floor, ceiling)
            b = rng.randrange(a + 1, ceiling + 1)
            holes = rng.randrange(0, b - a)
            f = Extent(Kind.FLOAT, pf, mf, nf, a, b, holes, b - a - holes)
        chain += [f, d]
        order = [len(chain) - 1, len(chain) - 2]
        expected = _general_joint_pages(chain, order, total)
        assert float_pair_pages(chain, order) == expected, (chain, expected)
        assert joint_pages(chain, order, total, hint=rng.randrange(0, 50)) == expected
        for n in (expected, expected + 1, rng.randrange(0, expected + 2)):
            assert joint_fits(chain, order, n, total) == (take_all(chain, order, n, total) is not None)
        assert not joint_fits(chain, order, expected + 1, total)
        _assert_column_twins(chain, order, total, expected)
    assert 500 < transparent < 2500  # both branches ran
    # other shapes are not its business: the search answers them
    assert float_pair_pages([up(3), flt(40, 50), down(40)], [1, 2]) is None  # the float first
    assert float_pair_pages([flt(40, 50), up(3), down(40)], [2, 0]) is None  # not adjacent
    assert float_pair_pages([up(3), flt(40, 50), down(40)], [2, 1, 0]) is None


def test_budget_closed_form_equals_the_general_search():
    import random

    from unikv.extent import budget_pages

    rng = random.Random(11)
    for _ in range(2000):
        total = rng.randrange(1_000, 50_000)
        cap = total - rng.randrange(0, 500)
        bands = []
        for _ in range(rng.randrange(1, 4)):
            pb = rng.choice([16, 48, 100, 300, 1000])
            num = total // pb
            mp = rng.randrange(1, 3)
            if num <= mp:  # a layout holds at least one page past the sink
                continue
            live = rng.randrange(0, max(1, (num - mp) // rng.choice([1, 2, 4])))
            bands.append(Extent(Kind.BUDGET, pb, mp, num, 0, 0, 0, live, cap))
        if not bands:
            continue
        order = rng.sample(range(len(bands)), rng.randrange(1, len(bands) + 1))
        expected = _general_joint_pages(bands, order, total)
        assert budget_pages(bands, order) == expected, (bands, order, expected)
        _assert_column_twins(bands, order, total, expected)
    assert budget_pages([up(3), down(40)], [0, 1]) is None


def test_region_column_twin_equals_the_scalar_form():
    import random

    rng = random.Random(5)
    for _ in range(500):
        regions, start = [], 1
        for pb in rng.sample([16, 48, 100, 300], rng.randrange(1, 4)):
            lo = start
            cap = lo + rng.randrange(1, 40)
            fill = rng.randrange(lo, cap + 1)
            holes = rng.randrange(0, fill - lo + 1)
            regions.append(Extent(Kind.REGION, pb, 1, 10_000 // pb, lo, fill, holes, fill - lo - holes, cap))
            start = cap
        order = rng.sample(range(len(regions)), rng.randrange(1, len(regions) + 1))
        _assert_column_twins(regions, order, 10_000, joint_pages(regions, order, 10_000))


def _assert_column_twins(chain, order, total, expected):
    """The column twins (`extent.*_columns`, as `unikv.samples` reads a
    run back) answer a one-row column of `chain` as the scalar forms do:
    the joint pages `expected` (None: a chain they do not take) and the
    gap bytes."""
    import numpy as np

    from unikv.extent import chain_gap_bytes_columns, joint_pages_columns

    cols = [{f: np.array([getattr(e, f)], dtype=np.int64) for f in ("low", "high", "holes", "live")}
            for e in chain]
    got = joint_pages_columns(chain, cols, order)
    assert (None if got is None else int(got[0])) == expected, (chain, order, expected)
    gap = chain_gap_bytes_columns(chain, cols, 100, total)
    assert int(np.asarray(gap).reshape(-1)[0]) == chain_gap_bytes(chain, 100, total), chain


# -- float relocation plans --

def test_absorb_plan_drops_boundary_holes_only():
    plan = absorb_plan(10, 20, [10, 11, 15, 19])
    assert (plan.low, plan.high, plan.holes, plan.srcs) == (12, 19, (15,), ())


def test_room_plan_vacates_the_strip_into_far_holes_then_the_far_gap():
    # span [40, 50) holes 41, 48; region [30, 60): high gap 10 pages, want 14
    plan = room_plan(40, 50, [41, 48], (30, 60), Side.HIGH, 14)
    # strip [46, 50): live 49, 47, 46 (48 is a hole, dropped) -> 41, then 39, 38
    assert plan.srcs == (49, 47, 46) and plan.dsts == (41, 39, 38)
    assert (plan.low, plan.high, plan.holes) == (38, 46, ())


def test_room_plan_keeps_the_far_gap_or_leapfrogs_only_as_far_as_needed():
    # span [40, 45) dense; region [30, 60): low gap 10, want 13 on the low side
    assert room_plan(40, 45, [], (30, 60), Side.LOW, 13).dsts == (45, 46, 47)
    # keeping 13 pages free above: the strip's pages cannot go up -> leapfrog
    # to [43, 48), not against the far edge [55, 60)
    plan = room_plan(40, 45, [], (30, 60), Side.LOW, 13, keep_far_pages=13)
    assert (plan.low, plan.high, plan.dsts) == (43, 48, (43, 44, 45, 46, 47))
    assert room_plan(40, 45, [], (30, 60), Side.LOW, 26) is None  # 25 free pages
    assert room_plan(40, 45, [], (30, 60), Side.LOW, 10).srcs == ()  # open already
