"""Small layouts for the conformance harness: fixed named chains for the
random driver and the soak, and the helper that grows a buffer until a pool
accepts it (the hypothesis strategy of `strategies.py` draws the rest)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from unikv.layout import Band, Grow, Layout, Unit

CHAINS = ("full", "full|swa", "swa|full", "mamba|full", "mamba|swa|full")
ENTRY_BYTES = {"full": 700, "swa": 300, "mamba": 5000}  # no one a multiple of another


def make_layout(chain: str, page_size: int, tokens: int, states: int = 8,
                entry_bytes: dict | None = None) -> Layout:
    """A small layout of a named chain.

    Args:
        chain: band names low -> high joined by "|", from `CHAINS` (the
            first band grows up, the last down, a middle one floats; "mamba"
            is a request band, the others token bands).
        page_size: token bands' page size.
        tokens: tokens of every token band the buffer holds past the sink.
        states: state slots of every state band it holds on top.
        entry_bytes: band name -> bytes per slot (default `ENTRY_BYTES`).
    """
    sizes = {**ENTRY_BYTES, **(entry_bytes or {})}
    names = chain.split("|")
    bands: list[Band] = []
    for i, name in enumerate(names):
        grow = Grow.DOWN if i == len(names) - 1 else Grow.UP if i == 0 else Grow.FLOAT
        if name == "mamba":
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, unit=Unit.REQUEST))
        else:
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, page_size=page_size))
    per_token = sum(b.entry_bytes for b in bands if b.unit is Unit.TOKEN)
    per_state = sum(b.entry_bytes for b in bands if b.unit is Unit.REQUEST)
    return Layout(total_bytes=sink_bytes(bands) + tokens * per_token + states * per_state, bands=tuple(bands))


def sink_bytes(bands: list[Band]) -> int:
    """The sink `Layout` reserves for `bands`: the largest entry, or token
    page, of any band."""
    return max([b.entry_bytes for b in bands] + [b.page_bytes for b in bands if b.unit is Unit.TOKEN])


_Built = TypeVar("_Built")


def grow_until_valid(build: Callable[[int], _Built], total: int, step: int) -> _Built:
    """`build(total)`, adding `step` bytes until it stops raising ValueError
    (64 tries; the last one's error propagates)."""
    for _ in range(64):
        try:
            return build(total)
        except ValueError:
            total += step
    return build(total)
