"""The backend interface: what the allocator core needs from a device."""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch


class Backend(Protocol):
    """Device, buffer, table and move kernels, and forward-done events.

    The core never branches on the backend: it calls these methods only.
    """

    device: torch.device
    materialized: bool  # True when `make_buffer` returns real bytes

    def make_buffer(self, total_bytes: int) -> Optional[torch.Tensor]:
        """A uint8 tensor of `total_bytes`, or None for byte accounting only."""

    def table(self, size: int) -> torch.Tensor:
        """An int64 page table of `size` entries, all -1."""

    def ids(self, values: Sequence[int]) -> torch.Tensor:
        """An int64 device tensor holding host `values`."""

    def arange(self, start: int, end: int) -> torch.Tensor:
        """int64 `[start, end)` on the device."""

    def to_host(self, t: torch.Tensor) -> list[int]:
        """Host copy of an int tensor (a device->host sync on real devices)."""

    def bind(self, v_pages, p_pages, v2p, p2v) -> None: ...

    def alloc_bind(self, v_pages, start, v2p, p2v) -> torch.Tensor:
        """Bind `v_pages` to the fresh range `[start, start + n)`; return it."""

    def free_unbind(self, v_pages, v2p, p2v) -> torch.Tensor: ...

    def remap_moved(self, src, dst, v2p, p2v) -> torch.Tensor: ...

    def move_pages(self, buffer, page_bytes: int, src, dst, disjoint: Optional[bool] = None) -> None:
        """Copy page rows src -> dst as if all sources were read first;
        `disjoint` (when the caller knows it) spares an overlap check."""

    def translate(self, v_tokens, v2p, page_size: int, multiplier: int = 1) -> torch.Tensor: ...

    def paged_extend(self, prefix_lens, seq_lens, last_loc, new_pages, page_size: int,
                     total_tokens: Optional[int] = None) -> torch.Tensor: ...

    def paged_decode(self, seq_lens, last_loc, new_pages, page_size: int) -> torch.Tensor: ...

    def new_event(self, label: str = "") -> Any:
        """A forward-done event the engine records after launching a forward."""

    def event_done(self, event: Any) -> bool:
        """Whether the forward behind `event` has finished (never blocks)."""

    def wait_event(self, event: Any) -> None:
        """Order all later allocator work after `event` (a stream wait)."""
