"""Hypothesis strategies of the conformance machine: the layouts it draws.

Needs hypothesis (the `test` extra); the rest of `unikv.testing` does not.
"""

from __future__ import annotations

from hypothesis import strategies as st

from unikv import Band, Grow, Layout, Unit
from unikv.testing.layouts import grow_until_valid, sink_bytes

# Chain shapes, grow directions low -> high ("state" is an up-growing request
# band), and the band names the machine gives them.
SHAPES = ("down", "up", "up|down", "state|down", "up|float|down", "state|float|down")
NAMES = {
    "down": ["full"], "up": ["full"], "up|down": ["swa", "full"], "state|down": ["mamba", "full"],
    "up|float|down": ["local", "swa", "full"], "state|float|down": ["mamba", "swa", "full"],
}


def _not_multiple(e: int, others: list[int]) -> bool:
    return all(e % x and x % e for x in others)


@st.composite
def layouts(draw, shapes=SHAPES) -> Layout:
    """A valid layout of one of `shapes`: no entry size divides another,
    token bands share a page size of 1-64 slots (and a kernel-facing
    blocks_per_page), and the buffer holds 1-24 pages per token band and
    1-12 slots per state band past the sink (so shortfalls are common)."""
    shape = draw(st.sampled_from(shapes), label="chain")
    ps = draw(st.one_of(st.sampled_from([1, 2, 4, 16]), st.integers(1, 64)), label="page_size")
    blocks = draw(st.sampled_from([1, 2, 6]), label="blocks_per_page")
    bands: list[Band] = []
    entries: list[int] = []
    for grow, name in zip(shape.split("|"), NAMES[shape]):
        state = grow == "state"
        e = draw(st.integers(8, 1200 if state else 160).filter(lambda e: _not_multiple(e, entries)),
                 label=f"{name}.entry_bytes")
        entries.append(e)
        if state:
            bands.append(Band(name, entry_bytes=e, grow=Grow.UP, unit=Unit.REQUEST))
        else:
            bands.append(Band(name, entry_bytes=e, grow=Grow(grow), page_size=ps, blocks_per_page=blocks))
    counts = [draw(st.integers(1, 12 if b.unit.value == "request" else 24), label=f"{b.name}.pages")
              for b in bands]
    max_pb = max(b.page_bytes for b in bands)
    slack = draw(st.integers(0, max_pb), label="slack_bytes")
    total = sink_bytes(bands) + sum(c * b.page_bytes for c, b in zip(counts, bands)) + slack
    return grow_until_valid(lambda t: Layout(total_bytes=t, bands=tuple(bands)), total, max_pb)
