"""Plain-torch reference of `move_pages`: copy page rows of one band's grid.

A band views the byte buffer as rows of `page_bytes`; page p is bytes
`[p * page_bytes, (p + 1) * page_bytes)`.
"""

from __future__ import annotations

import torch


def page_rows(buffer: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """`[num_pages, page_bytes]` uint8 view of `buffer` on a band's grid
    (the bytes past the last whole page are left out)."""
    num_pages = buffer.numel() // page_bytes
    return buffer[: num_pages * page_bytes].view(num_pages, page_bytes)


def move_pages(buffer: torch.Tensor, page_bytes: int, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy page rows `src[i] -> dst[i]` of `buffer` in place.

    Args:
        buffer: 1-D contiguous uint8 tensor.
        page_bytes: bytes per page.
        src, dst: int64 [n] page indices; destinations unique.
    The result is as if every source row were read before any destination
    row is written, so an overlapping ordered shift is allowed.
    """
    rows = page_rows(buffer, page_bytes)
    rows[dst] = rows[src]
