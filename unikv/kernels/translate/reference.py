"""Plain-torch reference of `translate`: virtual token ids -> physical ids.

Token t of virtual page `t // page_size` sits at offset `t % page_size`; its
physical slot is `v2p[t // page_size] * page_size + t % page_size`, and its
kernel-facing id (layer-major pages of `multiplier` blocks) is
`v2p[t // page_size] * page_size * multiplier + t % page_size`.
"""

from __future__ import annotations

import torch


def translate(
    v_tokens: torch.Tensor, v2p: torch.Tensor, page_size: int, multiplier: int = 1
) -> torch.Tensor:
    """Virtual token ids -> physical slot ids (`multiplier` 1) or
    kernel-facing ids (`multiplier` = blocks per page). Tombstones -> 0.

    Args:
        v_tokens: int64 [n] virtual token ids (pages inside `v2p`).
        v2p: int64 [virtual pages] table, -1 where unbound.
    Returns:
        int64 [n].
    """
    pages = torch.div(v_tokens, page_size, rounding_mode="floor")
    offsets = v_tokens - pages * page_size
    phys = v2p.index_select(0, pages)
    ids = phys * (page_size * multiplier) + offsets
    return torch.where(phys < 0, torch.zeros_like(ids), ids)


def translate_pages(v_pages: torch.Tensor, v2p: torch.Tensor) -> torch.Tensor:
    """Virtual page ids (any shape) -> physical pages; tombstones (-1) -> 0.

    What an engine's block table needs: one gather from `v2p`, so the
    tables can hold virtual pages and a move changes only `v2p`.

    Args:
        v_pages: int64 / int32 virtual page ids inside `v2p`, any shape.
        v2p: int64 [virtual pages] table, -1 where unbound.
    Returns:
        int64, `v_pages`' shape.
    """
    phys = v2p.index_select(0, v_pages.reshape(-1))
    return phys.clamp_(min=0).view(v_pages.shape)
