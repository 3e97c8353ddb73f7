"""The sim backend: CPU memory, optional real bytes, simulated events.

Numpy only (no torch): the "device" is the host, so the device table arena
is the host arena itself, a materialised buffer is a numpy uint8 array, and
page moves and translation are numpy operations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from unikv import paged


class SimEvent:
    """A forward-done event in simulated time.

    The simulator (or a test) calls `fire()` when the forward it stands for
    finishes; callbacks registered with `on_fire` run then, e.g. to write the
    forward's KV bytes. A stream wait on an unfired event completes the
    forward at that point of program order: on one simulated device, work
    ordered after the event cannot start before it.
    """

    __slots__ = ("fired", "_callbacks", "label")

    def __init__(self, label: str = "") -> None:
        self.fired = False
        self._callbacks: list[Callable[[], None]] = []
        self.label = label

    def on_fire(self, fn: Callable[[], None]) -> None:
        """Run `fn` when the event fires (at once if it already has)."""
        if self.fired:
            fn()
        else:
            self._callbacks.append(fn)

    def query(self) -> bool:
        return self.fired

    def fire(self) -> None:
        """Mark the forward finished and run its callbacks once."""
        if self.fired:
            return
        self.fired = True
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    synchronize = fire

    def __repr__(self) -> str:
        return f"SimEvent({self.label!r}, fired={self.fired})"


class SimBackend:
    """CPU backend for simulation and tests.

    The "device" is the host: page tables are the allocator's own host
    arrays (no commit needed), the buffer is a numpy array, and the pool
    hands ids out as numpy arrays by default (`native_ids`; a pool built
    with `ids="torch"` wraps them, zero-copy).

    Args:
        materialize: allocate a real byte buffer whose page moves copy bytes
            (so tests can prove moves keep data intact); False keeps byte
            accounting only, for fast simulation.
    """

    shares_host_memory = True
    native_ids = "numpy"
    device = "cpu"

    def __init__(self, materialize: bool = False) -> None:
        self.materialized = bool(materialize)

    def __repr__(self) -> str:
        return f"SimBackend(materialize={self.materialized})"

    def make_buffer(self, total_bytes: int) -> np.ndarray | None:
        """A zeroed uint8 array of `total_bytes`, or None without `materialize`."""
        if not self.materialized:
            return None
        return np.zeros(total_bytes, dtype=np.uint8)

    def mirror(self, host: np.ndarray) -> np.ndarray:
        return host  # the device arena is the host arena

    def scatter(self, table: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
        raise RuntimeError("internal: the sim backend's tables are the host tables; nothing to commit")

    def upload(self, values: np.ndarray) -> np.ndarray:
        return values

    def new_event(self, label: str = "") -> SimEvent:
        return SimEvent(label)

    def event_done(self, event: SimEvent) -> bool:
        return event.query()

    def wait_event(self, event: SimEvent) -> None:
        event.synchronize()

    translate = staticmethod(paged.translate)

    def move_pages(self, buffer, page_bytes: int, src: np.ndarray, dst: np.ndarray, disjoint=None) -> None:
        """Copy page rows `src -> dst` of `buffer` (a uint8 array) on a grid
        of `page_bytes`; the gather copies every source row before the
        scatter writes, so any overlap is fine."""
        if buffer is None:
            return
        rows = buffer[: len(buffer) // page_bytes * page_bytes].reshape(-1, page_bytes)
        rows[dst] = rows[src]
