"""unikv.kernels.move.kernel: the Triton page move against its torch reference."""

import pytest
import torch

pytest.importorskip("triton")

from unikv.kernels.move import kernel as triton_move  # noqa: E402
from unikv.kernels.move import reference  # noqa: E402

PAGE_BYTES = [1, 3, 100, 4096, 12288]
COUNTS = [0, 1, 7, 301]


def random_buffer(num_pages: int, page_bytes: int, gen, device, slack: int = 5) -> torch.Tensor:
    """Random bytes for `num_pages` pages plus a few bytes off the grid."""
    return torch.randint(0, 256, (num_pages * page_bytes + slack,), dtype=torch.uint8, generator=gen).to(device)


def check_move(buf, page_bytes, src, dst, device, **kw):
    want = buf.clone()
    reference.move_pages(want, page_bytes, src, dst)
    triton_move.move_pages(buf, page_bytes, src.to(device), dst.to(device), **kw)
    assert torch.equal(buf.cpu(), want.cpu())


@pytest.mark.parametrize("page_bytes", PAGE_BYTES)
@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("shape", ["disjoint", "shift_down", "shift_up", "compact", "cycles"])
def test_move_pages_matches_reference(page_bytes, n, shape, gen, device, move_batch):
    num_pages = 2 * n + 5
    src, dst = move_batch(shape, n, num_pages, gen)
    check_move(random_buffer(num_pages, page_bytes, gen, device), page_bytes, src, dst, device)


@pytest.mark.parametrize("page_bytes", [3, 4096])
def test_disjoint_promise_is_one_launch_without_host_read(page_bytes, gen, device, move_batch):
    src, dst = move_batch("disjoint", 40, 100, gen)
    check_move(random_buffer(100, page_bytes, gen, device), page_bytes, src, dst, device, disjoint=True)


@pytest.mark.parametrize("shape", ["shift_down", "compact", "cycles"])
def test_small_stage_splits_rounds(shape, gen, device, move_batch):
    """A temp buffer of 4 pages forces many staging rounds; still exact."""
    page_bytes, n = 100, 60
    src, dst = move_batch(shape, n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, page_bytes, gen, device)
    check_move(buf, page_bytes, src, dst, device, stage_bytes=4 * page_bytes)


@pytest.mark.parametrize("shape", ["shift_up", "compact", "cycles"])
def test_host_pages_plan_without_a_device_read(shape, gen, device, move_batch):
    """The caller's host copy of the page lists plans an overlapping move."""
    n = 50
    src, dst = move_batch(shape, n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, 100, gen, device)
    check_move(buf, 100, src, dst, device, host_pages=(src.numpy(), dst.numpy()))


def test_unaligned_buffer_falls_back_to_narrow_words(gen, device, move_batch):
    base = random_buffer(50, 64, gen, device, slack=64)
    buf = base[3:3 + 50 * 64]  # odd address: only byte words fit
    assert triton_move.word_view(buf, 64)[1] == 1
    src, dst = move_batch("disjoint", 20, 50, gen)
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


# -- bounded grid: at most max_programs programs, each looping over its tiles --


@pytest.mark.parametrize("page_bytes", [3, 100, 12288])
@pytest.mark.parametrize("max_programs", [1, 3, 8])
@pytest.mark.parametrize("shape", ["disjoint", "shift_down", "shift_up", "compact", "cycles"])
def test_bounded_grid_matches_reference(page_bytes, max_programs, shape, gen, device, move_batch):
    """Every batch shape (the overlapping ones through their plans: waves,
    staged rounds, stashed cycles) copies exactly on a bounded grid."""
    n = 37
    src, dst = move_batch(shape, n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, page_bytes, gen, device)
    check_move(buf, page_bytes, src, dst, device, max_programs=max_programs)


@pytest.mark.parametrize("max_programs", [1, 5])
def test_bounded_grid_over_chunked_pages_and_small_tiles(max_programs, gen, device, move_batch):
    """Pages split into chunks (tiles of 256 bytes) and staged rounds of 4
    pages: a program loops over many (row group, chunk) items."""
    page_bytes, n = 1000, 23
    src, dst = move_batch("shift_down", n, 2 * n + 5, gen)
    buf = random_buffer(2 * n + 5, page_bytes, gen, device)
    check_move(buf, page_bytes, src, dst, device, max_programs=max_programs, tile_bytes=256,
               stage_bytes=4 * page_bytes)
    src, dst = move_batch("disjoint", n, 2 * n + 5, gen)
    check_move(buf, page_bytes, src, dst, device, max_programs=max_programs, tile_bytes=256, disjoint=True)


def test_bounded_grid_size():
    t = triton_move.tiling(row_elems=1000, word_bytes=8, tile_bytes=256)  # 32 words a tile: chunks of a row
    assert t.work(10) == 10 * t.chunks_per_row > 8
    assert t.grid(10) == (t.work(10),)
    assert t.grid(10, max_programs=8) == (8,)
    assert t.grid(1, max_programs=10 ** 6) == (t.work(1),)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_bad_max_programs_is_refused_before_any_copy(bad, device):
    buf = torch.arange(100, dtype=torch.uint8, device=device)
    before = buf.clone()
    ids = torch.arange(3, device=device)
    with pytest.raises(ValueError, match=r"move_pages: max_programs=.* must be a positive integer"):
        triton_move.move_pages(buf, 10, ids, ids + 3, max_programs=bad)
    assert torch.equal(buf, before)
