"""The soak driver's checker bites: planted corruptions are reported."""

from __future__ import annotations

import random

import pytest
import torch

from unikv import UnifiedPool
from unikv.backends import SimBackend
from unikv.testing import Driver, make_layout, pattern_rows


def make_driver(chain: str = "full", page_size: int = 1, mode: str = "lazy", seed: int = 0,
                ops: int = 0) -> Driver:
    pool = UnifiedPool(make_layout(chain, page_size, 200), backend=SimBackend(materialize=True),
                       compaction=mode)
    driver = Driver(pool, random.Random(seed))
    assert driver.run(ops) == []
    return driver


def joined(violations: list[str]) -> str:
    return "\n".join(violations)


def two_live_pages(driver: Driver, band: str = "full") -> tuple[int, int]:
    pages = torch.unique(torch.nonzero(driver.live[band]).flatten() // driver.ps).tolist()
    assert len(pages) >= 2
    return pages[0], pages[-1]


@pytest.fixture
def busy() -> Driver:
    """A 3-band driver after a healthy random run, holding live pages."""
    driver = make_driver("mamba|swa|full", 16, "lazy", seed=3, ops=300)
    driver.fire()
    if len(driver.reqs) < 2:
        assert driver.extend([], [], [40, 40]) is not None
    assert driver.check() == []
    return driver


def test_pattern_rows_are_distinct_and_deterministic():
    rows = pattern_rows(torch.arange(1, 2001), 300)
    assert len({bytes(r.tolist()) for r in rows}) == 2000
    assert torch.equal(rows, pattern_rows(torch.arange(1, 2001), 300))


def test_healthy_random_run_reports_nothing():
    driver = make_driver("mamba|swa|full", 16, "eager", seed=1, ops=400)
    assert driver.counts["shortfall"] > 0
    assert driver.check() == []


def test_flipped_byte_of_a_live_page(busy):
    token = int(torch.nonzero(busy.live["full"]).flatten()[-1])
    slot = int(busy.pool.translate([token], "full"))
    busy.pool.buffer_view("full")[slot, 123] ^= 0xFF
    out = joined(busy.check())
    assert "[full] 1 live slots hold wrong bytes" in out and f"virtual [{token}]" in out


def test_flipped_byte_of_a_state_slot(busy):
    sid = int(torch.nonzero(busy.live["mamba"]).flatten()[0])
    slot = int(busy.pool.translate([sid], "mamba"))
    busy.pool.buffer_view("mamba")[slot, 4999] ^= 1
    assert "[mamba] 1 live slots hold wrong bytes" in joined(busy.check())


def test_swapped_v2p_entries(busy):
    a, b = two_live_pages(busy)
    v2p = busy.pool.bands["full"].v2p  # planting a core bug: private on purpose
    v2p[a], v2p[b] = int(v2p[b]), int(v2p[a])
    out = joined(busy.check())
    assert "[full] v2p and p2v are not inverse" in out and "live slots hold wrong bytes" in out


def test_aliased_pages_overlap(busy):
    a, b = two_live_pages(busy, "swa")
    busy.pool.bands["swa"].v2p[a] = int(busy.pool.bands["swa"].v2p[b])
    assert "live pages overlap" in joined(busy.check())


def test_page_leaked_behind_the_engines_back(busy):
    busy.free_request(next(iter(busy.reqs)))  # make room: the pool may be full
    assert busy.pool.alloc(16) is not None
    assert "pool reports" in joined(busy.check())


def test_move_kernel_that_copies_nothing():
    driver = make_driver("mamba|swa|full", 16, "eager", seed=2)
    driver.pool.backend.move_pages = lambda buffer, page_bytes, src, dst, **kw: None
    assert "hold wrong bytes" in joined(driver.run(2000))


def test_move_kernel_that_copies_half_a_page():
    driver = make_driver("full|swa", 1, "lazy", seed=4)
    backend = driver.pool.backend

    def half_move(buffer, page_bytes, src, dst, **kw):
        rows = buffer[: buffer.numel() // page_bytes * page_bytes].view(-1, page_bytes)
        rows[dst, : page_bytes // 2] = rows[src, : page_bytes // 2]

    backend.move_pages = half_move
    assert "hold wrong bytes" in joined(driver.run(2000))


def _forward_over_moved_pages(hide_forward: bool) -> Driver:
    """X then A admitted on a lazy full band (A below X), A decodes and a
    forward over A launches; X is freed and a non-urgent flush packs A's
    pages into X's holes. With `hide_forward` the pool is told a finished
    forward instead, as a core that forgot the forward would behave."""
    driver = make_driver("full", 1, "lazy")
    (x,) = driver.extend([], [], [10])
    (a,) = driver.extend([], [], [10])
    driver.decode([a])
    forward = driver.launch()
    assert forward is not None
    if hide_forward:
        done = driver.pool.backend.new_event("done")
        done.fire()
        driver.pool.set_inflight_forward(done, write_ids=None)
    driver.free_request(x)
    driver.pool.flush(urgent=False)
    driver.admit_alloc(10)  # takes the pages the flush vacated
    driver.fire()
    return driver


def test_forward_respected_by_the_core_is_clean():
    assert _forward_over_moved_pages(hide_forward=False).check() == []


def test_forward_write_to_a_moved_page():
    driver = _forward_over_moved_pages(hide_forward=True)
    written = driver.reqs[2].tokens[-1]  # A's decoded token: the forward wrote it
    bad = [v for v in driver.check() if "live slots hold wrong bytes" in v]
    assert bad and str(written) in bad[0].split("virtual")[1].split("at physical")[0]


def test_reuse_of_a_page_the_forward_still_reads():
    out = joined(_forward_over_moved_pages(hide_forward=True).check())
    assert "read hazard" in out


def test_available_size_probe_flags_a_lying_view(busy, monkeypatch):
    real = busy.pool.available_size()
    monkeypatch.setattr(busy.pool, "available_size", lambda schedulable=False: real + 16 * 1000)
    busy.probe_available()
    assert "returned None" in joined(busy.check())
