"""unikv.samples: a run's pool samples read back in bulk equal the live
`usage()` / `available_size()` calls, sample by sample."""

import random

import pytest

from unikv import OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend
from unikv.testing import CHAINS, Driver, make_layout

KEYS = ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes", "low_byte", "high_byte")


@pytest.mark.parametrize("kind", ["unified", "eager", "static", "oracle"])
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_sample_columns_equal_the_live_views(kind, chain):
    layout = make_layout(chain, 2, 300)
    backend = SimBackend(materialize=kind != "oracle")
    p = {"unified": lambda: UnifiedPool(layout, backend=backend),
         "eager": lambda: UnifiedPool(layout, backend=backend, compaction="eager"),
         "static": lambda: StaticPartitionPool(layout, backend=backend),
         "oracle": lambda: OraclePool(layout)}[kind]()
    driver = Driver(p, random.Random(hash((kind, chain)) % 1000), check_overlap=kind != "oracle")
    samples, live = [], []
    for _ in range(250):
        driver.step()
        samples.append(p.sample())
        live.append((p.usage(), p.available_size()))
    cols = p.sample_columns(samples)
    for r, ((free, gap, bands), avail) in enumerate(live):
        assert (cols["free_bytes"][r], cols["gap_bytes"][r], cols["available_tokens"][r]) == (free, gap, avail)
        for name, values in zip(layout.names, bands):
            assert tuple(cols[f"{name}_{k}"][r] for k in KEYS) == values, (r, name)
    assert all(c.dtype == "int64" and len(c) == len(samples) for c in cols.values())


def test_no_samples_give_empty_columns():
    p = UnifiedPool(make_layout("swa|full", 2, 100))
    cols = p.sample_columns([])
    assert cols["available_tokens"].shape == (0,) and cols["swa_live_bytes"].shape == (0,)
