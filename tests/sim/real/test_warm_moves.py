"""sim.real.executor.warm_up_moves: the page-move path run before the clock on
a scratch pool of the run pool's bands, leaving the run's pool as it was."""

import numpy as np
import pytest
import torch
from unikv.sim.real import executor as ex

from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import CudaBackend

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs CUDA"), pytest.mark.gpu])]


def two_band(total=4000 * 16 * 1024):
    return Layout(total_bytes=total, bands=[
        Band("swa", entry_bytes=512, grow="up", page_size=16, blocks_per_page=4),
        Band("full", entry_bytes=1024, grow="down", page_size=16, blocks_per_page=8)])


def state_band():
    return Layout(total_bytes=4000 * 16 * 1024, bands=[
        Band("mamba", entry_bytes=4096, grow="up", page_size=1, unit="request"),
        Band("full", entry_bytes=1024, grow="down", page_size=16, blocks_per_page=8)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,compaction", [(two_band, "lazy"), (two_band, "eager"), (state_band, "lazy")])
def test_the_warm_up_moves_pages_of_every_launch_kind_and_leaves_the_pool_alone(monkeypatch, device, layout,
                                                                               compaction):
    from unikv.kernels.move import kernel

    launches = []

    real = kernel.copy_rows

    def counting(src_flat, src_rows, *args, **kwargs):
        launches.append(int(src_rows.numel()))
        return real(src_flat, src_rows, *args, **kwargs)

    monkeypatch.setattr(kernel, "copy_rows", counting)
    pool = UnifiedPool(layout(), backend=CudaBackend(device), compaction=compaction)
    held = pool.alloc(64)
    rng = np.random.default_rng(0)
    buffer = torch.as_tensor(pool.buffer)
    buffer.copy_(torch.as_tensor(rng.integers(0, 255, buffer.numel(), dtype=np.uint8)))
    tables = {b: torch.as_tensor(pool.page_table(b)).clone() for b in pool.layout.names if b != "mamba"}
    before = (pool.stats(), buffer.clone(), tables)
    moves = ex.warm_up_moves(pool, device)
    assert len(moves) == len(ex.WARM_PAGES) and all(m > 0 for m in moves), moves
    if kernel._INTERPRETED or device == "cuda":  # the Triton kernel ran (not the torch reference)
        # a launch of 1 page, of a multiple of 16 and of another count: Triton compiles each apart
        assert 1 in launches and any(n % 16 == 0 for n in launches) and any(n % 16 not in (0, 1) for n in launches)
    stats, bytes_, tables = before
    assert pool.stats() == stats and torch.equal(torch.as_tensor(pool.buffer), bytes_)
    assert all(torch.equal(torch.as_tensor(pool.page_table(b)), t) for b, t in tables.items())
    assert pool.verify() == [] and held is not None


def test_a_pool_that_never_moves_a_page_is_not_warmed():
    assert ex.warm_up_moves(OraclePool(two_band()), "cpu") == []
    assert ex.warm_up_moves(StaticPartitionPool(two_band(), CudaBackend("cpu")), "cpu") == []
