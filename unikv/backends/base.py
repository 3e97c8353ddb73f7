"""The backend interface: what the allocator core needs from a device."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch


class Backend(Protocol):
    """Device, buffer, table mirror, move kernel and forward-done events.

    The allocator decides everything on the host (`unikv.tables`); a backend
    only mirrors those decisions on its device. The core never branches on
    the backend: it calls these methods only.
    """

    device: torch.device
    materialized: bool  # True when `make_buffer` returns real bytes
    shares_host_memory: bool  # True when `mirror` returns the host array itself

    def make_buffer(self, total_bytes: int) -> torch.Tensor | None:
        """A uint8 tensor of `total_bytes`, or None for byte accounting only."""

    def mirror(self, host: np.ndarray) -> torch.Tensor:
        """The device copy of the host int64 table arena."""

    def scatter(self, table: torch.Tensor, idx: np.ndarray, values: np.ndarray) -> None:
        """`table[idx] = values` on the device, from host arrays, without a
        host wait (one upload, one launch)."""

    def upload(self, values: np.ndarray) -> torch.Tensor:
        """Host int64 values as a device tensor (asynchronous)."""

    def move_pages(self, buffer, page_bytes: int, src: np.ndarray, dst: np.ndarray,
                   disjoint: bool | None = None) -> None:
        """Copy page rows src -> dst as if all sources were read first;
        `disjoint` (known on the host) spares an overlap check."""

    def translate(self, v_tokens: torch.Tensor, v2p: torch.Tensor, page_size: int,
                  multiplier: int = 1) -> torch.Tensor:
        """Virtual token ids -> physical ids on the device (tombstones -> 0)."""

    def new_event(self, label: str = "") -> Any:
        """A forward-done event the engine records after launching a forward."""

    def event_done(self, event: Any) -> bool:
        """Whether the forward behind `event` has finished (never blocks)."""

    def wait_event(self, event: Any) -> None:
        """Order all later allocator work after `event` (a stream wait)."""
