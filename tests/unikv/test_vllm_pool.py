"""VllmPool: vLLM's one block pool for every KV-cache group, behind the pool surface.

The conformance machine runs it too (tests/property/test_machine.py, kind
"vllm"); these tests pin the block arithmetic by hand.
"""

import numpy as np
import pytest

from unikv import Band, Layout
from unikv.backends import SimBackend
from unikv.baselines import VllmPool


def granite_like(total: int = 100_000) -> Layout:
    """Blocks of 1,000 B: one full group (page of 4 tokens = 1 block), and a
    mamba slot of 3 groups x 1 block; sink 3,000 B (the mamba entry)."""
    return Layout(total_bytes=total, bands=[
        Band("mamba", entry_bytes=3_000, grow="up", unit="request"),
        Band("full", entry_bytes=250, grow="down", page_size=4),
    ])


def swa_full(total: int = 100_000) -> Layout:
    """Blocks of 800 B: swa 5 groups (a 2-token page = 5 blocks), full 1 group."""
    return Layout(total_bytes=total, bands=[
        Band("swa", entry_bytes=2_000, grow="up", page_size=2),
        Band("full", entry_bytes=400, grow="down", page_size=2),
    ])


def vllm(layout: Layout, block_bytes: int | None = None, **kw) -> VllmPool:
    return VllmPool(layout, SimBackend(), block_bytes=block_bytes, ids="numpy", **kw)


def test_blocks_of_the_budget_with_block_zero_the_null_block():
    p = vllm(granite_like(100_500), 1_000)
    assert (p.total_blocks, p.usable_blocks) == (100, 99)  # 100,500 // 1,000; block 0 is null
    assert p.page_blocks() == {"mamba": 3, "full": 1}
    assert p.available_size() == 99 * 4  # every usable block as one full page
    assert p.available_state("mamba") == 33  # the budget, not a grid cut after a 3-block sink
    occ = p.occupancy()
    assert (occ["total_bytes"], occ["sink_bytes"]) == (100_500, 1_000)
    assert occ["free_bytes"] == 100_500 - 1_000  # the remainder past block 99 counts as free
    assert occ["blocks"] == {"total": 100, "usable": 99, "live": 0, "free": 99}


def test_any_free_block_serves_any_group():
    p = vllm(granite_like(), 1_000)
    s = p.alloc_state("mamba", 30)  # 90 of 99 blocks
    assert p.available_size() == 9 * 4
    v = p.alloc(36)
    assert p.alloc(4) is None and p.alloc_state("mamba", 1) is None
    assert p.free_blocks() == 0
    p.free_state("mamba", s[:10])  # 30 blocks back: tokens may take them
    assert p.available_size() == 30 * 4
    w = p.alloc(120)
    assert w is not None and p.free_blocks() == 0
    p.free(v)
    p.free(w)
    assert p.available_state("mamba") == 33 - 20
    assert p.verify() == []
    assert p.stats()["vllm"]["peak_live_blocks"] == 99


def test_window_groups_release_their_blocks_alone():
    p = vllm(swa_full(), 800)
    assert p.page_blocks() == {"swa": 5, "full": 1}
    usable = p.usable_blocks
    v = p.alloc(20)  # 10 pages: 60 blocks
    assert p.free_blocks() == usable - 60
    p.release(v[:8], "swa")  # 4 pages left the window: 20 blocks back
    assert p.free_blocks() == usable - 40
    assert p.verify() == []


def test_default_block_is_the_gcd_of_the_pages():
    p = vllm(swa_full())  # pages 4,000 and 800 B
    assert p.block_bytes == 800


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"block_bytes": 700}, ["not whole 700-byte blocks", "'full': 800"]),
    ({"block_bytes": 0}, ["block_bytes=0"]),
    ({"prefix_caching": "yes"}, ["prefix_caching='yes'"]),
])
def test_bad_arguments_are_named(kwargs, words):
    with pytest.raises(ValueError) as exc:
        vllm(swa_full(), **kwargs)
    for w in words:
        assert w in str(exc.value)


def test_a_materialised_backend_is_refused():
    with pytest.raises(ValueError, match="materialize=False"):
        VllmPool(swa_full(), SimBackend(materialize=True))


def test_freeing_everything_returns_every_block():
    p = vllm(granite_like(), 1_000)
    ids = [p.alloc_extend([0], [10], [-1], 10) for _ in range(5)]
    s = p.alloc_state("mamba", 4)
    for v in ids:
        p.free(v)
    p.free_state("mamba", s)
    assert p.free_blocks() == p.usable_blocks
    assert np.array_equal(p.live_ids(), np.zeros(0, dtype=np.int64))
    assert p.verify() == []
