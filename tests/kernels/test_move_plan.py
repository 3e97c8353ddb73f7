"""unikv.kernels.move.plan: the host plan of an overlapping page-move batch."""

import pytest

from unikv.kernels.move import plan as move_plan


def simulate(plan, pages: dict) -> dict:
    """Run a plan over a dict page -> content, launch by launch (each launch
    reads all its sources before writing)."""
    store = {"buffer": dict(pages), "temp": {}, "stash": {}}
    for c in plan:
        vals = [store[c.src_kind][r] for r in c.src_rows]
        for r, v in zip(c.dst_rows, vals):
            store[c.dst_kind][r] = v
    return store["buffer"]


@pytest.mark.parametrize("shape", ["disjoint", "shift_down", "shift_up", "compact", "cycles"])
@pytest.mark.parametrize("stage_rows", [1, 3, 1000])
def test_plan_is_exact_and_short(shape, stage_rows, gen, move_batch):
    n, num_pages = 300, 605
    src, dst = (t.tolist() for t in move_batch(shape, n, num_pages, gen))
    plan = move_plan.plan_moves(src, dst, stage_rows)
    pages = {p: p for p in range(num_pages)}
    want = dict(pages)
    want.update({d: s for s, d in zip(src, dst)})
    assert simulate(plan, pages) == want
    if stage_rows == 1000:  # one staged round or a few waves
        assert len(plan) <= max(5, move_plan.MAX_WAVES)
    if shape == "disjoint":
        assert len(plan) == 1


@pytest.mark.parametrize("distance", [1, 2, 75, 150])
def test_shift_plans_waves_or_rounds(distance):
    """A shift by d of n pages has n/d levels: waves when few, else staged
    rounds of three launches."""
    n = 600
    src = list(range(distance, distance + n))
    dst = [p - distance for p in src]
    plan = move_plan.plan_moves(src, dst, max_stage_rows=10_000)
    levels = -(-n // distance)
    if levels <= move_plan.MAX_WAVES:
        assert len(plan) == levels and all(c.src_kind == c.dst_kind == "buffer" for c in plan)
    else:
        assert len(plan) == 3
    pages = {p: p for p in range(n + distance)}
    want = dict(pages)
    want.update({d: s for s, d in zip(src, dst)})
    assert simulate(plan, pages) == want


def test_large_pages_prefer_waves():
    """With MiB pages, staging's extra traffic outweighs extra launches."""
    src = list(range(16, 16 + 512))
    dst = [p - 16 for p in src]  # 32 levels
    assert len(move_plan.plan_moves(src, dst, 10_000, page_bytes=4096)) == 3
    assert len(move_plan.plan_moves(src, dst, 10_000, page_bytes=4 << 20)) == 32


def test_plan_rejects_repeated_destinations():
    with pytest.raises(ValueError, match="dst repeats"):
        move_plan.plan_moves([1, 2], [3, 3], 10)
    with pytest.raises(ValueError, match="src repeats"):
        move_plan.plan_moves([1, 1], [1, 2], 10)
