"""Distinct byte patterns and small layouts for soak and property tests."""

from __future__ import annotations

import torch

from unikv.layout import Band, Layout, Unit

_NOISE = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def pattern_rows(stamps: torch.Tensor, entry_bytes: int) -> torch.Tensor:
    """`[n, entry_bytes]` uint8 rows, distinct per stamp: the stamp's
    little-endian bytes, then a noise window the stamp selects."""
    stamps = stamps.to(torch.int64)
    span = _NOISE.numel() - entry_bytes
    if span <= 0:
        raise ValueError(f"entry_bytes={entry_bytes} exceeds the {_NOISE.numel()}-byte pattern source")
    rows = _NOISE.unfold(0, entry_bytes, 1)[(stamps * 7919) % span]
    k = min(8, entry_bytes)
    rows[:, :k] = stamps.reshape(-1, 1).view(torch.uint8)[:, :k]
    return rows


CHAINS = ("full", "full|swa", "swa|full", "mamba|full", "mamba|swa|full")
ENTRY_BYTES = {"full": 700, "swa": 300, "mamba": 5000}  # no one a multiple of another


def make_layout(chain: str, page_size: int, tokens: int, states: int = 8,
                entry_bytes: dict | None = None) -> Layout:
    """A small layout for soak and property tests.

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
    bands = []
    for i, name in enumerate(names):
        grow = "down" if i == len(names) - 1 else "up" if i == 0 else "float"
        if name == "mamba":
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, unit="request"))
        else:
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, page_size=page_size))
    per_token = sum(b.entry_bytes for b in bands if b.unit is Unit.TOKEN)
    per_state = sum(b.entry_bytes for b in bands if b.unit is Unit.REQUEST)
    sink = max([b.entry_bytes for b in bands] + [b.page_bytes for b in bands if b.unit is Unit.TOKEN])
    return Layout(total_bytes=sink + tokens * per_token + states * per_state, bands=bands)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous uint8 tensors hold equal bytes (compared in
    the widest words their size allows: much faster than a byte compare)."""
    n = a.numel()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if n % width == 0:
            return torch.equal(a.reshape(-1).view(dtype), b.reshape(-1).view(dtype))
    return torch.equal(a, b)
