"""Every chain `Layout` accepts is one the allocator supports.

Exhaustive over grow x unit for every band up to one past the longest
supported chain: a chain outside `SUPPORTED_CHAINS` is refused with the one
error that lists them; every accepted one builds pools (unified lazy and
eager, static, oracle) that allocate on every band and pass `verify()`
fresh and after allocs, releases, frees and flushes (sizes drawn by
hypothesis).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend
from unikv.layout import SUPPORTED_CHAINS, Grow, Unit, supported_chains

MAX_BANDS = max(len(c) for c in SUPPORTED_CHAINS)
SPECS = [(g, u) for g in Grow for u in Unit]
COMBOS = [c for n in range(1, MAX_BANDS + 2) for c in itertools.product(SPECS, repeat=n)]
ACCEPTED = [c for c in COMBOS if tuple(g for g, _ in c) in SUPPORTED_CHAINS]


def label(combo) -> str:
    return "|".join(f"{g.value}/{u.value}" for g, u in combo)


def bands_of(combo, entry=(64, 256), page_size=4) -> list[Band]:
    return [Band(f"b{i}", entry_bytes=entry[u is Unit.REQUEST], grow=g, unit=u,
                 page_size=page_size if u is Unit.TOKEN else 1)
            for i, (g, u) in enumerate(combo)]


def test_the_supported_chains_are_the_four_the_bands_implement():
    assert supported_chains() == "up, down, up|down, up|float|down"
    assert len(ACCEPTED) == 2 + 2 + 4 + 8  # every unit on every band


def test_every_unsupported_chain_is_refused_with_the_supported_ones_listed():
    listed = "supported chains are up, down, up|down, up|float|down"
    refused = 0
    for combo in COMBOS:
        try:
            Layout(total_bytes=1 << 16, bands=bands_of(combo))
        except ValueError as exc:
            assert combo not in ACCEPTED and listed in str(exc), (label(combo), str(exc))
            refused += 1
        else:
            assert combo in ACCEPTED, label(combo)
    assert refused == len(COMBOS) - len(ACCEPTED) > 1000


POOLS = {
    "lazy": lambda layout: UnifiedPool(layout, SimBackend(), compaction="lazy"),
    "eager": lambda layout: UnifiedPool(layout, SimBackend(), compaction="eager"),
    "static": lambda layout: StaticPartitionPool(layout, SimBackend()),
    "oracle": lambda layout: OraclePool(layout, SimBackend()),
}


@pytest.mark.parametrize("kind", list(POOLS))
@pytest.mark.parametrize("combo", ACCEPTED, ids=label)
@settings(max_examples=12)
@given(token_entry=st.integers(8, 200), state_entry=st.integers(8, 600),
       page_size=st.sampled_from([1, 2, 4, 16]), room=st.integers(8, 24), rounds=st.integers(1, 4))
def test_an_accepted_chain_allocates_on_every_band_and_verifies(combo, kind, token_entry, state_entry,
                                                                page_size, room, rounds):
    bands = bands_of(combo, (token_entry, state_entry), page_size)
    # Room for `room` pages of every band past the sink (a static region
    # each): at least the 2 pages a round takes, times 4 rounds (none freed).
    total = max(b.page_bytes for b in bands) * (1 + room * len(bands))
    pool = POOLS[kind](Layout(total_bytes=total, bands=bands))
    assert pool.verify() == []
    held = exercise(pool, rounds)
    for name, ids in held:
        if name is None:
            pool.free(ids)
        else:
            pool.free_state(name, ids)
    pool.flush(urgent=True)
    assert pool.verify() == []
    assert not any(len(pool.live_ids(b.name)) for b in pool.layout.state_bands)
    assert not pool.token_names or len(pool.live_ids()) == 0


def exercise(pool, rounds: int) -> list:
    """`rounds` allocs on every band, freeing and releasing some on the way,
    `verify()` after each step; returns what is still held."""
    held: list = []
    ps = pool.page_size
    for r in range(rounds):
        if pool.token_names:
            ids = pool.alloc(2 * ps)
            assert ids is not None, f"round {r}: no token pages"
            pool.release(ids[:ps], pool.token_names[-1])
            # The only token band's release was the first page's last binding.
            held.append((None, ids[ps:] if len(pool.token_names) == 1 else ids))
        for band in pool.layout.state_bands:
            slots = pool.alloc_state(band.name, 2)
            assert slots is not None, f"round {r}: no state slot on {band.name!r}"
            held.append((band.name, slots))
        assert pool.verify() == []
        if r % 2:
            name, ids = held.pop(0)
            pool.free(ids) if name is None else pool.free_state(name, ids)
            pool.flush()
            assert pool.verify() == []
    return held
