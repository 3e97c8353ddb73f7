"""The random driver and the harness's checkers bite: planted corruptions are
reported (the conformance machine's own bite is tests/property/test_planted_bugs.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from unikv import UnifiedPool
from unikv.backends import SimBackend
from unikv.backends.sim import SimEvent
from unikv.testing import Driver, HostEvents, host, host_ids, make_layout, pattern


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
    pages = sorted(driver.model.bound(band))
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


def test_patterns_are_distinct_and_deterministic():
    rows = pattern(np.arange(1, 2001), 300)
    assert rows.dtype == np.uint8 and rows.shape == (2000, 300)
    assert len({r.tobytes() for r in rows}) == 2000
    assert np.array_equal(rows, pattern(list(range(1, 2001)), 300))
    assert rows[258, :8].tobytes() == (259).to_bytes(8, "little")  # the stamp's own bytes first
    assert pattern([5], 3).tobytes() == (5).to_bytes(8, "little")[:3]


def test_host_copies_lists_arrays_and_tensors():
    import torch

    for ids in ([3, 1], np.array([3, 1]), torch.tensor([3, 1])):
        out = host_ids(ids)
        assert out.dtype == np.int64 and out.tolist() == [3, 1]
    assert host_ids([]).dtype == np.int64 and host_ids([]).size == 0
    assert host(torch.zeros(2, 3, dtype=torch.uint8)).shape == (2, 3)


def test_host_events_wrap_a_backend_but_not_its_events():
    inner = SimBackend(materialize=True)
    backend = HostEvents(inner)
    assert backend.materialized and len(backend.make_buffer(8)) == 8  # delegated
    event = backend.new_event("fwd")
    assert isinstance(event, SimEvent) and not backend.event_done(event)
    backend.wait_event(event)  # a wait on a running forward finishes it
    assert backend.event_done(event)


def test_healthy_random_run_reports_nothing():
    driver = make_driver("mamba|swa|full", 16, "eager", seed=1, ops=400)
    assert driver.counts["shortfall"] > 0
    assert driver.check() == []


def test_flipped_byte_of_a_live_page(busy):
    token = max(busy.model.stamps["full"])
    slot = int(host_ids(busy.pool.translate([token], "full"))[0])
    busy.pool.buffer_view("full")[slot, 123] ^= 0xFF
    out = joined(busy.check())
    assert "[full] 1 live slots hold wrong bytes" in out and f"virtual [{token}]" in out


def test_flipped_byte_of_a_state_slot(busy):
    sid = min(busy.model.states["mamba"])
    slot = int(host_ids(busy.pool.translate([sid], "mamba"))[0])
    busy.pool.buffer_view("mamba")[slot, 4999] ^= 1
    assert "[mamba] 1 live slots hold wrong bytes" in joined(busy.check())


def test_swapped_v2p_entries(busy):
    a, b = two_live_pages(busy)
    v2p = busy.pool.bands["full"].v2p  # planting a core bug: private on purpose
    v2p[a], v2p[b] = int(v2p[b]), int(v2p[a])
    out = joined(busy.check())
    assert "[full] v2p and p2v are not inverse" in out and "live slots hold wrong bytes" in out
    assert "[full] kernel-facing ids" not in out  # translate and kernel ids still agree


def test_aliased_pages_overlap(busy):
    a, b = two_live_pages(busy, "swa")
    busy.pool.bands["swa"].v2p[a] = int(busy.pool.bands["swa"].v2p[b])
    assert "live slot pairs overlap" in joined(busy.check())


def test_page_leaked_behind_the_engines_back(busy):
    busy.free_request(next(iter(busy.reqs)))  # make room: the pool may be full
    assert busy.pool.alloc(16) is not None
    out = joined(busy.check())
    assert "[full] bound pages differ from the model: pool-only [" in out and "live_bytes" in out


def test_move_kernel_that_copies_nothing():
    driver = make_driver("mamba|swa|full", 16, "eager", seed=2)
    driver.pool.backend.move_pages = lambda buffer, page_bytes, src, dst, **kw: None
    assert "hold wrong bytes" in joined(driver.run(2000))


def test_move_kernel_that_copies_half_a_page():
    driver = make_driver("full|swa", 1, "lazy", seed=4)
    backend = driver.pool.backend

    def half_move(buffer, page_bytes, src, dst, **kw):
        flat = np.asarray(buffer)  # shares the buffer's memory (numpy, or a CPU tensor)
        rows = flat[: flat.size // page_bytes * page_bytes].reshape(-1, page_bytes)
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
