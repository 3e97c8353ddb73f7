"""The memory layer's accounting check: what requests and the prefix cache
hold is exactly what the pool holds.

A violation-list checker (empty = healthy), run every `check_every` steps;
it recomputes what `Memory` keeps incrementally (held totals, cached bytes)
and compares with the pool's live pages and slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unikv.sim.request import Request

if TYPE_CHECKING:
    from unikv.sim.memory import Memory


def check_holdings(mem: Memory, running: list[Request]) -> list[str]:
    """The pages `running` and the cache hold equal the pool's live pages;
    the state slots likewise (and the running ones kept for the forward are
    the running requests' own); the held totals and the window ratchet are up
    to date; each cache node's bytes are what the pool binds for it."""
    out = []
    held = [p for r in running for p in r.pages[r.shared_pages:]] + mem.meta_pages
    states = [r.state for r in running if r.state is not None]
    states += [s for r in running for s in mem.extra_states.get(r.rid, ())]
    if mem.cache is not None:
        for node in mem.cache.walk():
            held.extend(node.pages)
            if node.state is not None:
                states.append(node.state)
    if mem.swa:
        late = [r.rid for r in running if (r.seq - mem.window) // mem.ps > r.swa_released]
        if late:
            out.append(f"requests {late[:8]} hold window pages the ratchet has not released")
    seq, pages = sum(r.seq for r in running), sum(len(r.pages) for r in running)
    window = sum(min(r.seq, mem.window_cap) for r in running)
    if (mem.held_seq, mem.held_pages, mem.held_window) != (seq, pages, window):
        out.append(f"held totals (seq {mem.held_seq}, pages {mem.held_pages}, window "
                   f"{mem.held_window}) != the running requests' ({seq}, {pages}, {window})")
    from unikv.sim.memory import GONE  # here: `sim.memory` imports this module

    held = [p for p in held if p != GONE]  # released pages the pool took back
    if len(set(held)) != len(held):
        out.append("a virtual page is held twice")
    if mem.cache is not None:
        out.extend(_check_cache_bytes(mem))
    pool = mem.pool
    if pool.token_names:
        live = set(pool.live_ids().tolist())
        if live != set(held):
            out.append(f"held pages {len(set(held))} != pool live pages {len(live)}")
    if mem.state_band is not None:
        kept = {r.rid: r.state for r in running if r.state is not None}
        if mem.running_states != kept:
            out.append(f"running state slots kept {sorted(mem.running_states.items())[:8]} != the running "
                       f"requests' {sorted(kept.items())[:8]}")
        live = set(pool.live_ids(mem.state_band).tolist())
        if live != set(states) or len(states) != len(set(states)):
            out.append(f"held state slots {len(states)} != pool live slots {len(live)}")
    return out


def _check_cache_bytes(mem: Memory) -> list[str]:
    """Each node's bytes are what its pages hold on the pool's token bands;
    the cache's evictable total is the sum over its unlocked nodes."""
    out = []
    for node in mem.cache.walk():
        if not node.pages:
            continue
        held = sum(mem.bound_pages(node.pages, band) * mem.ps * entry
                   for band, entry in mem.token_bytes.items())
        if held != node.nbytes:
            out.append(f"cache node {node.key}: nbytes {node.nbytes} != {held} bound in the pool")
    slow = mem.cache.evictable_bytes_slow()
    if mem.cache.evictable_bytes != slow:
        out.append(f"evictable bytes {mem.cache.evictable_bytes} != {slow} recomputed from the cache")
    return out
