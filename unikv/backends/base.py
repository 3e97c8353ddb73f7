"""The backend interface: what the allocator core needs from a device."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Backend(Protocol):
    """Device, buffer, table mirror, move kernel and forward-done events.

    The allocator decides everything on the host (`unikv.tables`); a backend
    only mirrors those decisions on its device. The core never branches on
    the backend: it calls these methods only. A "device array" is the
    backend's own array type: a numpy array on the sim backend (its device
    is the host), a torch tensor on the CUDA backend.
    """

    device: Any  # "cpu" on the sim backend, a `torch.device` on the CUDA backend
    materialized: bool  # True when `make_buffer` returns real bytes
    shares_host_memory: bool  # True when `mirror` returns the host array itself
    native_ids: str  # the pool's default `ids`: "numpy" or "torch"

    def make_buffer(self, total_bytes: int) -> Any:
        """A uint8 device array of `total_bytes`, or None for byte accounting only."""

    def mirror(self, host: np.ndarray) -> Any:
        """The device copy of the host int64 table arena."""

    def scatter(self, table: Any, idx: np.ndarray, values: np.ndarray) -> None:
        """`table[idx] = values` on the device, from host arrays, without a
        host wait (one upload, one launch)."""

    def upload(self, values: np.ndarray) -> Any:
        """Host int64 values as a device array (asynchronous)."""

    def move_pages(self, buffer, page_bytes: int, src: np.ndarray, dst: np.ndarray,
                   disjoint: bool | None = None) -> None:
        """Copy page rows src -> dst as if all sources were read first;
        `disjoint` (known on the host) spares an overlap check."""

    def translate(self, v_tokens: Any, v2p: Any, page_size: int, multiplier: int = 1) -> Any:
        """Virtual token ids -> physical ids on the device (tombstones -> 0)."""

    def new_event(self, label: str = "") -> Any:
        """A forward-done event the engine records after launching a forward."""

    def event_done(self, event: Any) -> bool:
        """Whether the forward behind `event` has finished (never blocks)."""

    def wait_event(self, event: Any) -> None:
        """Order all later allocator work after `event` (a stream wait)."""
