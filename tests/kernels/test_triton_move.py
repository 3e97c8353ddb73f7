"""The Triton page-move kernel against `reference.move_pages`."""

import pytest
import torch

pytest.importorskip("triton")

from unikv.kernels import reference, triton_move, triton_move_plan  # noqa: E402

PAGE_BYTES = [1, 3, 100, 4096, 12288]
COUNTS = [0, 1, 7, 300]


def random_buffer(num_pages: int, page_bytes: int, gen, device, slack: int = 5) -> torch.Tensor:
    """Random bytes for `num_pages` pages plus a few bytes off the grid."""
    return torch.randint(0, 256, (num_pages * page_bytes + slack,), dtype=torch.uint8, generator=gen).to(device)


def moves(shape: str, n: int, num_pages: int, gen):
    """(src, dst) page lists of one batch shape, as int64 CPU tensors."""
    perm = torch.randperm(num_pages, generator=gen)
    if shape == "disjoint":
        return perm[:n], perm[n:2 * n]
    if shape == "shift_down":  # pack a run down over itself by a few pages
        src = torch.arange(num_pages - n, num_pages)
        return src, src - min(3, num_pages - n)
    if shape == "shift_up":
        src = torch.arange(0, n)
        return src, src + min(2, num_pages - n)
    if shape == "compact":  # live pages with holes packed to the bottom, order kept
        src = torch.sort(perm[:n]).values
        return src, torch.arange(n)
    if shape == "cycles":  # sources permuted among themselves
        src = perm[:n]
        return src, src[torch.randperm(n, generator=gen)]
    raise AssertionError(shape)


def check_move(buf, page_bytes, src, dst, device, **kw):
    want = buf.clone()
    reference.move_pages(want, page_bytes, src, dst)
    triton_move.move_pages(buf, page_bytes, src.to(device), dst.to(device), **kw)
    assert torch.equal(buf.cpu(), want.cpu())


@pytest.mark.parametrize("page_bytes", PAGE_BYTES)
@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("shape", ["disjoint", "shift_down", "shift_up", "compact", "cycles"])
def test_move_pages_matches_reference(page_bytes, n, shape, gen, device):
    num_pages = 2 * n + 5
    src, dst = moves(shape, n, num_pages, gen)
    check_move(random_buffer(num_pages, page_bytes, gen, device), page_bytes, src, dst, device)


@pytest.mark.parametrize("page_bytes", [3, 4096])
def test_disjoint_promise_is_one_launch_without_host_read(page_bytes, gen, device):
    src, dst = moves("disjoint", 40, 100, gen)
    check_move(random_buffer(100, page_bytes, gen, device), page_bytes, src, dst, device, disjoint=True)


@pytest.mark.parametrize("shape", ["shift_down", "compact", "cycles"])
def test_small_stage_splits_rounds(shape, gen, device):
    """A temp buffer of 4 pages forces many staging rounds; still exact."""
    page_bytes, n = 100, 60
    src, dst = moves(shape, n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, page_bytes, gen, device)
    check_move(buf, page_bytes, src, dst, device, stage_bytes=4 * page_bytes)


@pytest.mark.parametrize("shape", ["shift_up", "compact", "cycles"])
def test_host_pages_plan_without_a_device_read(shape, gen, device):
    """The caller's host copy of the page lists plans an overlapping move."""
    n = 50
    src, dst = moves(shape, n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, 100, gen, device)
    check_move(buf, 100, src, dst, device, host_pages=(src.numpy(), dst.numpy()))


def test_unaligned_buffer_falls_back_to_narrow_words(gen, device):
    base = random_buffer(50, 64, gen, device, slack=64)
    buf = base[3:3 + 50 * 64]  # odd address: only byte words fit
    assert triton_move.word_view(buf, 64)[1] == 1
    src, dst = moves("disjoint", 20, 50, gen)
    check_move(buf, 64, src, dst, device)


def test_word_width():
    buf = torch.zeros(4096, dtype=torch.uint8)
    assert triton_move.word_view(buf, 4096)[1] == 8
    assert triton_move.word_view(buf, 12)[1] == 4
    assert triton_move.word_view(buf, 6)[1] == 2
    assert triton_move.word_view(buf, 3)[1] == 1


def test_tiling_grids_over_chunks_of_large_pages():
    t = triton_move.tiling(row_elems=(1 << 20) // 8, word_bytes=8)
    assert t.rows == 1 and t.chunks_per_row * t.block * 8 >= 1 << 20
    small = triton_move.tiling(row_elems=4096 // 8, word_bytes=8)
    assert small.chunks_per_row == 1 and small.rows > 1


# -- the plan of an overlapping batch --


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
def test_plan_is_exact_and_short(shape, stage_rows, gen):
    n, num_pages = 300, 605
    src, dst = (t.tolist() for t in moves(shape, n, num_pages, gen))
    plan = triton_move_plan.plan_moves(src, dst, stage_rows)
    pages = {p: p for p in range(num_pages)}
    want = dict(pages)
    want.update({d: s for s, d in zip(src, dst)})
    assert simulate(plan, pages) == want
    if stage_rows == 1000:  # one staged round or a few waves
        assert len(plan) <= max(5, triton_move_plan.MAX_WAVES)
    if shape == "disjoint":
        assert len(plan) == 1


@pytest.mark.parametrize("distance", [1, 2, 75, 150])
def test_shift_plans_waves_or_rounds(distance):
    """A shift by d of n pages has n/d levels: waves when few, else staged
    rounds of three launches."""
    n = 600
    src = list(range(distance, distance + n))
    dst = [p - distance for p in src]
    plan = triton_move_plan.plan_moves(src, dst, max_stage_rows=10_000)
    levels = -(-n // distance)
    if levels <= triton_move_plan.MAX_WAVES:
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
    assert len(triton_move_plan.plan_moves(src, dst, 10_000, page_bytes=4096)) == 3
    assert len(triton_move_plan.plan_moves(src, dst, 10_000, page_bytes=4 << 20)) == 32


def test_plan_rejects_repeated_destinations():
    with pytest.raises(ValueError, match="dst repeats"):
        triton_move_plan.plan_moves([1, 2], [3, 3], 10)
    with pytest.raises(ValueError, match="src repeats"):
        triton_move_plan.plan_moves([1, 1], [1, 2], 10)


def test_checks(device):
    buf = torch.zeros(1000, dtype=torch.uint8, device=device)
    ids = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="buffer has dtype torch.int32"):
        triton_move.move_pages(buf.view(torch.int32), 4, ids, ids)
    with pytest.raises(ValueError, match="page_bytes=0"):
        triton_move.move_pages(buf, 0, ids, ids)
    with pytest.raises(ValueError, match="lengths differ"):
        triton_move.move_pages(buf, 10, ids, ids[:1])
    with pytest.raises(ValueError, match="outside the grid"):
        triton_move.move_pages(buf, 10, ids, ids + 99)
