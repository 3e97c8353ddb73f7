"""A short demo: a 3-band pool (mamba | swa float | full) serving a batch."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from unikv.backends.sim import SimBackend
from unikv.layout import Band, Layout
from unikv.pool import UnifiedPool

if TYPE_CHECKING:
    import torch

MIB = 1 << 20


def demo_layout(total_bytes: int = 256 * MIB) -> Layout:
    """A small hybrid: 24 KiB/token full KV, 8 KiB/token window KV, 1 MiB state."""
    return Layout(total_bytes=total_bytes, bands=[
        Band("mamba", entry_bytes=1 * MIB, grow="up", unit="request"),
        Band("swa", entry_bytes=8 * 1024, grow="float", page_size=16),
        Band("full", entry_bytes=24 * 1024, grow="down", page_size=16),
    ])


def _host_ids(ids: np.ndarray | torch.Tensor | None, call: str) -> np.ndarray:
    """The ids of a prefill `call`: the demo's sim-backend pool returns
    numpy ids, and its layout holds the whole prefill."""
    if ids is None:
        raise RuntimeError(f"demo: {call} did not fit the demo layout")
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"demo: {call} returned {type(ids).__name__}; expected numpy ids")
    return ids


def _print_occupancy(pool: UnifiedPool, title: str) -> None:
    occ = pool.occupancy()
    print(f"\n{title}: available {pool.available_size()} tokens, "
          f"{pool.available_state('mamba')} state slots, gap {occ['gap_bytes'] / MIB:.2f} MiB")
    print(f"  {'band':6} {'low MiB':>8} {'high MiB':>9} {'live':>6} {'holes':>6} {'pending':>8}")
    for name, b in occ["bands"].items():
        print(f"  {name:6} {b['low_byte'] / MIB:8.2f} {b['high_byte'] / MIB:9.2f} "
              f"{b['live_pages']:6d} {b['hole_pages']:6d} {b['pending_pages']:8d}")


def run_demo(compaction: str = "lazy", steps: int = 200, seed: int = 0, window: int = 256) -> int:
    """Admit requests, decode with a sliding window, finish some; print."""
    rng = random.Random(seed)
    pool = UnifiedPool(demo_layout(), backend=SimBackend(), compaction=compaction)
    ps = pool.page_size
    reqs: list[list[np.ndarray]] = []  # [token ids, state id]
    for _ in range(8):
        n = rng.randrange(1, 20) * ps
        reqs.append([_host_ids(pool.alloc(n), f"alloc({n})"),
                     _host_ids(pool.alloc_state("mamba", 1), "alloc_state('mamba', 1)")])
    _print_occupancy(pool, "after prefill of 8 requests")
    for step in range(steps):
        seq = np.array([len(r[0]) + 1 for r in reqs], dtype=np.int64)
        last = np.array([r[0][-1] for r in reqs], dtype=np.int64)
        new = pool.alloc_decode(seq, last)
        if new is None:
            print(f"step {step}: out of memory")
            break
        for r, t in zip(reqs, new):
            r[0] = np.append(r[0], t)
            out = len(r[0]) - window
            if out > 0 and out % ps == 0:  # a whole page left the window
                pool.release(r[0][out - ps:out], "swa", start_pos=out - ps)
        if step % 50 == 49:
            done = reqs.pop(rng.randrange(len(reqs)))
            pool.free(done[0])
            pool.free_state("mamba", done[1])
        pool.flush()
    _print_occupancy(pool, f"after {steps} decode steps ({compaction} compaction)")
    stats = pool.stats()
    print(f"\nmoves {stats['moves']} ({stats['moved_bytes'] / MIB:.2f} MiB), "
          f"flushes {stats['flushes']}, verify: {pool.verify() or 'healthy'}")
    return 0
