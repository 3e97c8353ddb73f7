"""The sim backend: CPU tensors, optional real bytes, simulated events."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from unikv.kernels import reference


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

    Args:
        materialize: allocate a real byte buffer whose page moves copy bytes
            (so tests can prove moves keep data intact); False keeps byte
            accounting only, for fast simulation.
    """

    def __init__(self, materialize: bool = False) -> None:
        self.materialized = bool(materialize)
        self.device = torch.device("cpu")

    def __repr__(self) -> str:
        return f"SimBackend(materialize={self.materialized})"

    def make_buffer(self, total_bytes: int) -> Optional[torch.Tensor]:
        if not self.materialized:
            return None
        return torch.zeros(total_bytes, dtype=torch.uint8)

    def table(self, size: int) -> torch.Tensor:
        return torch.full((size,), -1, dtype=torch.int64)

    def ids(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    def arange(self, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.int64)

    def to_host(self, t: torch.Tensor) -> list[int]:
        return t.tolist()

    def new_event(self, label: str = "") -> SimEvent:
        return SimEvent(label)

    def event_done(self, event: SimEvent) -> bool:
        return event.query()

    def wait_event(self, event: SimEvent) -> None:
        event.synchronize()

    bind = staticmethod(reference.bind)
    alloc_bind = staticmethod(reference.alloc_bind)
    free_unbind = staticmethod(reference.free_unbind)
    remap_moved = staticmethod(reference.remap_moved)
    translate = staticmethod(reference.translate)
    paged_extend = staticmethod(reference.paged_extend)
    paged_decode = staticmethod(reference.paged_decode)

    def move_pages(self, buffer, page_bytes: int, src, dst, disjoint=None) -> None:
        if buffer is not None:  # gather-then-scatter: any overlap is fine
            reference.move_pages(buffer, page_bytes, src, dst)
