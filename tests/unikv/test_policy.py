"""The shortfall ladder and the float relocation policy, end to end."""

import torch
from factories import fill, full_swa, mamba_full, pool, read, three_band

from unikv.policy import flush_targets


def test_joint_capacity_counts_one_sided_holes_hand_computed():
    p = pool(full_swa(), "lazy")
    assert p.available_size() == 32  # (1+n)*200 <= (100-n)*100
    v = p.alloc(10)  # full phys 1..10, swa phys 90..99
    p.release(v[5:], "swa")  # 5 swa holes (interior: 90 is live)
    # n: full extends n; swa drains 5 then extends n-5:
    # (11+n)*200 <= (90-(n-5))*100  ->  n <= 24
    assert p.available_size() == 24
    assert p.available_size(schedulable=True) == 24


def test_coupled_shortfall_flushes_every_band_then_fits():
    p = pool(full_swa(), "lazy")
    v = p.alloc(32)  # full 1..32, swa 68..99; gap 200 B
    data = fill(p, v, "full", 1)
    p.release(v[8:24], "swa")  # swa holes 76..91, interior
    assert p.available_size() == 1
    assert p.available_size(schedulable=True) == 6
    w = p.alloc(4)  # the ladder packs swa: 8 moves, then (33+n)*200 <= (84-n)*100
    assert w is not None and p.stats()["moves"] == 8
    assert p.stats()["ladder_runs"] == 1 and p.available_size() == 2
    assert torch.equal(read(p, v, "full"), data)
    assert p.verify() == []


def test_eager_compacts_at_release_so_no_ladder_is_needed():
    p = pool(full_swa(), "eager")
    v = p.alloc(32)
    p.release(v[8:24], "swa")
    assert p.stats()["moves"] == 8 and p.available_size() == 6


def test_shortfall_returns_none_with_nothing_allocated():
    p = pool(full_swa(), "lazy")
    v = p.alloc(32)
    data = fill(p, v, "swa", 2)
    p.release(v[8:24], "swa")
    free_ids = p.vids.free_count
    assert p.alloc(7) is None  # 6 after the ladder's flush
    assert p.vids.free_count == free_ids
    assert p.stats()["ladder_failures"] == 1
    live = torch.cat([v[:8], v[24:]])
    assert torch.equal(read(p, live, "swa"), torch.cat([data[:8], data[24:]]))
    assert p.verify() == []


def test_state_shortfall_flushes_the_growth_side_neighbour():
    p = pool(mamba_full(), "lazy")
    s = p.alloc_state("mamba", 3)  # mamba 1..3
    v = p.alloc(10)  # full [40, 50)
    p.free(v[:5])  # full holes 40..44 at its frontier: absorbed only by a flush
    assert p.available_state("mamba") == 4  # up to full's low byte 8000
    t = p.alloc_state("mamba", 5)
    assert t is not None and p.stats()["moves"] == 0
    assert p.translate(t, "mamba").tolist() == [4, 5, 6, 7, 8]
    assert p.bands["full"].watermark == 45
    assert p.verify() == [] and s is not None


def test_state_shortfall_slides_the_float_away():
    p = pool(three_band(), "eager")
    v = p.alloc(10)  # swa [40, 50), full [40, 50)
    data = fill(p, v, "swa", 3)
    assert p.available_state("mamba") == 3
    # demand 5 mamba pages: low side short by 2000 B, high side has 3000 B
    # -> make_room(low, 5000 + 1000 slack): needs 30 swa pages > 10 live: leapfrog
    s = p.alloc_state("mamba", 5)
    assert s is not None
    assert (p.bands["swa"].low, p.bands["swa"].high) == (70, 80)
    assert p.stats()["moves"] == 10 and p.stats()["relocations"] == 1
    assert torch.equal(read(p, v, "swa"), data)
    assert p.verify() == []


def test_coupled_shortfall_opens_the_float_side_facing_full():
    p = pool(three_band(), "lazy")
    v = p.alloc(10)  # swa [40, 50) splits the free bytes 3000 | 3000
    assert p.available_size() == 15
    # Through the ladder: slide swa down against mamba, [1000, 2000); then
    # swa grows up from 2000 and full down from 8000: 2000 + 100n <= 8000 - 200n.
    assert p.available_size(schedulable=True) == 20
    w = p.alloc(18)  # full needs 18*200 = 3600 B on the high side
    assert w is not None and p.stats()["relocations"] == 1
    assert p.verify() == []
    assert v is not None


def test_the_schedulable_view_is_what_the_ladder_realises_with_a_slide():
    p = pool(three_band(), "lazy")
    p.alloc(10)
    n = p.available_size(schedulable=True)
    assert n == 20 and p.alloc(n) is not None  # one relocation, no room left
    assert p.stats()["relocations"] == 1 and p.available_size(schedulable=True) == 0
    assert p.verify() == []


def test_flush_targets():
    p = pool(three_band(), "lazy")
    def names(q, demand):
        return [q.chain.bands[i].name for i in flush_targets(q.chain.extents(), demand)]
    # Never the float: its absorption is planned with the relocation.
    assert names(p, {0: 1}) == ["full"]
    assert names(p, {1: 2, 2: 2}) == ["mamba", "full"]
    q = pool(mamba_full(), "lazy")
    assert names(q, {0: 1}) == ["full"]
    assert names(q, {1: 1}) == ["mamba"]


def test_the_last_resort_slide_packs_the_float_when_hole_moves_fall_short(monkeypatch):
    """Found by a random search: the float's holes are spent by boundary
    moves, so opening room on one side starves the float's own extension;
    packing the float against the far neighbour fits one more page."""
    from unikv import Band, Layout, UnifiedPool, policy
    from unikv.backends import SimBackend

    p = UnifiedPool(Layout(total_bytes=40_000, bands=[
        Band("mamba", entry_bytes=2000, grow="up", unit="request"),
        Band("swa", entry_bytes=300, grow="float", page_size=1),
        Band("full", entry_bytes=70, grow="down", page_size=1)]), SimBackend(), compaction="lazy")
    reqs = [p.alloc(10), p.alloc(18)]
    p.alloc_state("mamba", 1)
    reqs += [p.alloc(16), p.alloc(9), p.alloc(7)]
    p.alloc_state("mamba", 1)
    reqs.append(p.alloc(17))
    for v, k in zip(reqs, (2, 1, 7, 7, 1)):
        p.release(v[:k], "swa")
    p.flush()
    assert p.available_size(schedulable=True) == 29
    real = policy._room_requests
    monkeypatch.setattr(policy, "_room_requests", lambda *a: iter(list(real(*a))[:-1]))
    p.epoch.bump()
    assert p.available_size(schedulable=True) == 28  # without the last resort
    monkeypatch.setattr(policy, "_room_requests", real)
    p.epoch.bump()
    assert p.alloc(29) is not None and p.verify() == []


def test_available_size_bound_counts_live_bytes_only_hand_computed():
    # full_swa: 10,000 B, sink 200 B; one joint page = 200 + 100 B.
    for kind in ("unified", "static", "oracle"):
        p = pool(full_swa(), "lazy", kind)
        assert p.available_size_bound() == 9800 // 300
        v = p.alloc(10)
        assert p.available_size_bound() == (9800 - 10 * 300) // 300
        p.release(v[5:], "swa")  # 5 swa pages are free bytes again, wherever they lie
        assert p.available_size_bound() == (9800 - 10 * 200 - 5 * 100) // 300
        assert p.available_size_bound() >= p.available_size(schedulable=True)
    m = pool(three_band())  # the state band's live bytes count too; no token: 0
    m.alloc_state("mamba", 2)
    assert m.available_size_bound() == (9000 - 2000) // 300
