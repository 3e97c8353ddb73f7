"""Soak: thousands of random engine operations per layout, checked after each.

Every op is followed by `Driver.check`, the conformance harness's invariant
(`unikv.testing.checks.pool_violations`): `verify() == []`, bound pages and
slots as the engine holds them, kernel-facing ids, every live slot's bytes
intact on every band still binding it, no two live slots sharing a byte,
and exact, fresh capacity views. The layouts' entry sizes are not
multiples of each other and the buffers are small, so shortfalls (and the
shortfall ladder) happen often.
"""

from __future__ import annotations

import random
import zlib

import pytest

from unikv import StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend
from unikv.testing import CHAINS, Driver, make_layout
from unikv.testing.checks import fresh_violations

OPS = 1500  # per run; the 3-band chain, the one with every mechanism, gets more
OPS_3BAND = 2500


def tokens_for(page_size: int) -> int:
    """Buffer capacity in tokens: a dozen average requests, so pools fill."""
    return max(300, 40 * page_size)


def make_pool(chain: str, page_size: int, mode: str):
    layout = make_layout(chain, page_size, tokens_for(page_size))
    backend = SimBackend(materialize=True)
    if mode == "static":
        return StaticPartitionPool(layout, backend=backend)
    return UnifiedPool(layout, backend=backend, compaction=mode)


def soak(pool, seed: int, ops: int = OPS) -> Driver:
    driver = Driver(pool, random.Random(seed))
    violations = driver.run(ops)
    assert violations == [], "\n".join(violations)
    return driver


def assert_drains_to_fresh(driver: Driver, chain: str, page_size: int, mode: str) -> None:
    """Invariant 7: freeing everything returns the pool to its cleared state."""
    pool = driver.pool
    driver.free_all()
    pool.flush(urgent=True)
    assert driver.check() == []
    assert fresh_violations(pool, make_pool(chain, page_size, mode)) == []


@pytest.mark.parametrize("mode", ["eager", "lazy"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chain", CHAINS)
def test_soak_unified(chain, page_size, mode):
    pool = make_pool(chain, page_size, mode)
    seed = zlib.crc32(f"{chain}/{page_size}/{mode}".encode())  # stable across runs
    driver = soak(pool, seed, OPS_3BAND if chain == "mamba|swa|full" else OPS)
    stats = pool.stats()
    # The run reached the paths it is meant to stress.
    assert driver.counts["shortfall"] > 20
    assert stats["ladder_runs"] > 0 and stats["moves"] > 0
    assert driver.counts["fired"] > 20
    if "swa" in chain:
        assert driver.counts["ratchet"] > 0
    if "|swa|" in chain:
        assert stats["relocations"] > 0
    assert_drains_to_fresh(driver, chain, page_size, mode)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chain", ["full|swa", "mamba|swa|full"])
def test_soak_static_partition(chain, page_size):
    pool = make_pool(chain, page_size, "static")
    driver = soak(pool, seed=page_size, ops=OPS_3BAND if chain == "mamba|swa|full" else OPS)
    assert driver.counts["shortfall"] > 20
    assert pool.stats()["moves"] == 0  # a static split never moves a page
    assert_drains_to_fresh(driver, chain, page_size, "static")


def test_static_partition_empty_has_no_holes():
    # Regression: an emptied region used to keep its fill watermark and
    # report every page it had handed out as a hole.
    pool = make_pool("full|swa", 1, "static")
    pool.free(pool.alloc(10))
    pool.flush(urgent=True)
    assert pool.occupancy() == make_pool("full|swa", 1, "static").occupancy()
