"""Whether one request fits a layout alone: the engine's own allocation path.

`fits_alone` replays one request on an empty pool of a `LayoutPlan` exactly
as the engine allocates it (a state slot, then prefill chunks with the window
ratchet between); `sim.layouts.check_fits` and the engine's rejection limit
(`max_request_tokens`) both decide with it, so they agree by construction.

A request longer than the model's maximum context never fits. The walk's
cost does not grow with the request's length:
- with a band that holds every token (full attention), each chunk adds
  pages that are never released, so the walk fails within the pool's
  capacity in chunks;
- where the window band is the only token band, what the pool holds during
  chunk k (from position s = k * c, chunk c, window W, page size ps) is
  ceil((s + c) / ps) - max(0, (s - W) // ps) pages (the window ratchet
  released the rest; `sim.memory.GONE`), plus the fixed state slot and meta
  pages. From the first chunk with s >= W on, that count depends on s only
  through s mod ps, which repeats every ps / gcd(c, ps) chunks; the last,
  shorter chunk needs no more than a full one from the same s. Every pool
  answers such a take by the count alone (holes are reused; the shortfall
  ladder packs the band), so once one period of full chunks past the
  window has fitted, every later chunk fits too (`steady_tokens`).
"""

from __future__ import annotations

import math

from unikv.sim.memory import Memory
from unikv.sim.request import Request

from unikv.backends import SimBackend


def over_context(model, tokens: int) -> bool:
    """Whether `tokens` exceeds the model's maximum context (False when unknown)."""
    return model.max_context_tokens is not None and tokens > model.max_context_tokens


def steady_tokens(mem: Memory, chunk: int) -> int | None:
    """The position from which a fitting walk of chunks of `chunk` tokens
    has seen every demand it will see again (module docstring), or None
    when the demand keeps growing (a token band besides the window band)."""
    if not mem.release_drops:
        return None
    first = -(-mem.window // chunk)  # the first chunk that starts at s >= W
    period = mem.ps // math.gcd(chunk, mem.ps)
    return (first + period) * chunk


def fits_alone(plan, tokens: int, *, prefill_chunk_tokens: int | None = None,
               compaction: str = "lazy", state_slots_per_request: int = 1,
               full_walk: bool = False) -> bool:
    """Whether an empty pool of `plan` holds one request of `tokens` tokens
    (all prompt: the worst case for a given total), prefilled in chunks of
    `prefill_chunk_tokens` (None: one forward) with the window ratchet between,
    holding `state_slots_per_request` state slots (the engine rules'). False
    for a request longer than the model's maximum context.

    `full_walk=True` walks every chunk instead of stopping once the window
    band's demand repeats (for tests holding the two equal).

    Raises:
        ValueError: the pool itself cannot be built (a band region too small).
    """
    model = plan.model
    if over_context(model, tokens):
        return False
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
    steady = None if full_walk else steady_tokens(mem, chunk)
    while req.seq < tokens:
        if steady is not None and req.seq >= steady:
            return True  # every later chunk's demand has fitted already
        if not mem.extend(req, min(chunk, tokens - req.seq)):
            return False
        mem.ratchet([req])
    return True


def max_request_tokens(plan, cap: int, *, prefill_chunk_tokens: int | None = None,
                       compaction: str = "lazy", state_slots_per_request: int = 1) -> int:
    """The most tokens (at most `cap`, and at most the model's maximum
    context) for which `fits_alone` holds (bisection)."""
    def fits(n: int) -> bool:
        return fits_alone(plan, n, prefill_chunk_tokens=prefill_chunk_tokens, compaction=compaction,
                          state_slots_per_request=state_slots_per_request)

    if plan.model.max_context_tokens is not None:
        cap = min(cap, plan.model.max_context_tokens)
    if fits(cap):
        return cap
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
