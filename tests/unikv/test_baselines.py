"""StaticPartitionPool and OraclePool answer the pool's surface."""

import pytest
import torch
from factories import fill, full_swa, pool, read, three_band

from unikv import OraclePool, StaticPartitionPool
from unikv.backends import SimBackend


def test_static_regions_hand_computed():
    p = pool(full_swa(), kind="static", fractions={"full": 0.5, "swa": 0.5})
    # 9,800 B past the sink: full [200, 5100) -> pages 1..24; swa [5100, 10000) -> 51..99
    assert (p.bands["full"].region_low, p.bands["full"].region_high) == (1, 25)
    assert (p.bands["swa"].region_low, p.bands["swa"].region_high) == (51, 100)
    assert p.available_size() == 24
    v = p.alloc(24)
    assert p.alloc(1) is None
    assert p.stats()["ladder_failures"] == 1
    p.release(v[:10], "swa")  # swa room does not help full
    assert p.available_size() == 0
    occ = p.occupancy()
    assert occ["bands"]["swa"]["occupied_bytes"] == 4900
    assert occ["gap_bytes"] == (49 - 24) * 100  # unfilled region of swa
    assert p.verify() == []


def test_static_reuses_freed_pages_in_place_and_never_moves():
    p = pool(three_band(), kind="static")
    v = p.alloc(6)
    data = fill(p, v, "full", 3)
    freed = p.translate(v[:3], "full").tolist()
    assert freed == [35, 36, 37]  # full's region: [7000, 10000) B = pages 35..49
    p.free(v[:3])
    w = p.alloc(3)
    assert sorted(p.translate(w, "full").tolist()) == freed
    assert torch.equal(read(p, v[3:], "full"), data[3:])
    assert p.flush(urgent=True) == 0 and p.stats()["moves"] == 0
    assert p.verify() == []


@pytest.mark.parametrize("fractions, needle", [
    ({"full": 0.5}, "expected exactly"),
    ({"full": 0.5, "swa": -0.1}, "positive"),
    ({"full": 0.7, "swa": 0.5}, "sum to 1.2"),
    ({"full": 0.999, "swa": 0.001}, "less than one"),
])
def test_static_rejects_bad_fractions(fractions, needle):
    with pytest.raises(ValueError, match=needle):
        StaticPartitionPool(full_swa(), fractions=fractions)


def test_oracle_is_a_pure_byte_budget():
    p = OraclePool(full_swa())
    assert p.available_size() == 9800 // 300
    v = p.alloc(10)
    p.release(v[5:], "swa")
    assert p.available_size() == (9800 - 2000 - 500) // 300
    assert p.occupancy()["gap_bytes"] == 0
    p.free(v)
    assert p.available_size() == 32 and p.verify() == []


def test_oracle_state_and_tokens_share_the_budget():
    p = OraclePool(three_band())
    assert p.available_state("mamba") == 9
    p.alloc(10)  # 3000 B
    assert p.available_state("mamba") == 6


def test_oracle_refuses_bytes():
    with pytest.raises(ValueError, match="no byte layout"):
        OraclePool(full_swa(), backend=SimBackend(materialize=True))
    with pytest.raises(ValueError, match="keeps no bytes"):
        OraclePool(full_swa()).buffer_view("full")


def test_oracle_admits_at_least_what_the_unified_pool_does():
    for mode in ("eager", "lazy"):
        u, o = pool(three_band(), mode), OraclePool(three_band())
        for n in (4, 7, 3, 9, 2):
            vu, vo = u.alloc(n), o.alloc(n)
            assert vo is not None or vu is None
            assert o.available_size() >= u.available_size()
