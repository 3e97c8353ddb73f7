"""The one shortfall path: evict cached prefixes (LRU), then retract.

Every allocation the scheduler makes (a decode batch, a prefill chunk, an
admission's state slot and first chunk) goes through `cover`, so the order
of remedies is the same at every call site: the pool's own ladder has already
run inside the failed attempt; then the least recently used cached prefix is
evicted and the attempt retried, until the cache has nothing left to evict;
then, where the caller allows it, the newest running request is retracted
and the attempt retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from unikv.sim.request import Request

T = TypeVar("T")


def cover(attempt: Callable[[], T | None], evict: Callable[[], bool],
          retract_newest: Callable[[], Request | None] | None = None,
          keep: Request | None = None) -> T | None:
    """`attempt()` until it allocates, remedying each shortfall.

    Args:
        attempt: tries the allocation; None when short (with nothing
            allocated), anything else on success.
        evict: evicts one cached prefix; False when none can be evicted.
        retract_newest: retracts the newest running request and returns it
            (None when no request runs); None: never retract (an admission
            does not push running requests back).
        keep: the request being served: once it is itself the victim,
            give up.
    Returns:
        `attempt()`'s answer, or None when the shortfall could not be
        covered (nothing left to evict and no victim, or `keep` retracted).
    """
    out = attempt()
    if out is None:
        out = remedy(attempt, evict, retract_newest, keep)
    return out


def remedy(attempt: Callable[[], T | None], evict: Callable[[], bool],
           retract_newest: Callable[[], Request | None] | None = None,
           keep: Request | None = None) -> T | None:
    """`cover` after `attempt()` has just fallen short (the caller made the
    first try itself, on its hot path): evict or retract, then try again,
    until it allocates or nothing is left to do. Arguments and answer as
    for `cover`."""
    while True:
        if not evict():
            victim = retract_newest() if retract_newest is not None else None
            if victim is None or victim is keep:
                return None
        out = attempt()
        if out is not None:
            return out
