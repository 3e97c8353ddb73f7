"""Whether one request fits a layout alone: the engine's own allocation path.

`fits_alone` replays one request on an empty pool of a `LayoutPlan` exactly
as the engine allocates it (a state slot, then prefill chunks with the window
ratchet between); `sim.layouts.check_fits` and the engine's rejection limit
(`max_request_tokens`) both decide with it, so they agree by construction.
"""

from __future__ import annotations

from unikv.sim.memory import Memory
from unikv.sim.request import Request

from unikv.backends import SimBackend


def fits_alone(plan, tokens: int, *, prefill_chunk_tokens: int | None = None,
               compaction: str = "lazy", state_slots_per_request: int = 1) -> bool:
    """Whether an empty pool of `plan` holds one request of `tokens` tokens
    (all prompt: the worst case for a given total), prefilled in chunks of
    `prefill_chunk_tokens` (None: one forward) with the window ratchet between,
    holding `state_slots_per_request` state slots (the engine rules').

    Raises:
        ValueError: the pool itself cannot be built (a band region too small).
    """
    model = plan.model
    pool = plan.make_pool(SimBackend(), compaction)
    try:
        mem = Memory(pool, window_tokens=model.window_tokens if model.swa_layers else None,
                     block_tokens=None, meta_tokens=model.meta_tokens,
                     state_slots_per_request=state_slots_per_request)
    except ValueError:  # not even the shared meta tokens fit
        return False
    req = Request(0, 0.0, tokens, 1)
    if not mem.take_state(req):
        return False
    chunk = prefill_chunk_tokens or max(tokens, 1)
    while req.seq < tokens:
        if not mem.extend(req, min(chunk, tokens - req.seq)):
            return False
        mem.ratchet([req])
    return True


def max_request_tokens(plan, cap: int, *, prefill_chunk_tokens: int | None = None,
                       compaction: str = "lazy", state_slots_per_request: int = 1) -> int:
    """The most tokens (at most `cap`) for which `fits_alone` holds (bisection)."""
    def fits(n: int) -> bool:
        return fits_alone(plan, n, prefill_chunk_tokens=prefill_chunk_tokens, compaction=compaction,
                          state_slots_per_request=state_slots_per_request)

    if fits(cap):
        return cap
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
