"""The harness's window on a pool of any backend: host copies of ids and
bytes, writes into the pool's buffer, and forward events the harness fires.

Everything the harness keeps is numpy on the host. Ids, translations and
buffer views may come back as numpy arrays, CPU tensors or device tensors
(a `CudaBackend`); `host` copies them to the host explicitly, so the harness
never needs torch to drive a sim-backend pool.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unikv.backends.sim import SimEvent


def host(x) -> np.ndarray:
    """`x` (a list, numpy array, CPU or device tensor) as a host numpy array
    (no copy for numpy and CPU tensors)."""
    if hasattr(x, "detach"):  # a torch tensor, maybe on a device
        return x.detach().cpu().numpy()
    return np.asarray(x)


def host_ids(x) -> np.ndarray:
    """`x` as a flat host int64 array (empty input included)."""
    return host(x).astype(np.int64, copy=False).reshape(-1)


def _on_device(view) -> bool:
    """Whether `view` is a tensor off the host (a CPU tensor is read as the
    numpy array sharing its memory: numpy's gathers are the faster here)."""
    return hasattr(view, "detach") and view.device.type != "cpu"


def read_rows(view, phys: np.ndarray) -> np.ndarray:
    """Rows `phys` of a `[slots, entry_bytes]` buffer view, copied to the host."""
    if _on_device(view):
        import torch  # only a tensor view gets here: torch is loaded

        return view.index_select(0, torch.as_tensor(phys, device=view.device)).cpu().numpy()
    return np.asarray(view)[phys]


def write_rows(view, phys: np.ndarray, rows: np.ndarray) -> None:
    """`view[phys] = rows` (host uint8 rows), on the view's device."""
    if not len(phys):
        return
    if _on_device(view):
        import torch

        idx = torch.as_tensor(phys, device=view.device)
        view.index_copy_(0, idx, torch.from_numpy(np.ascontiguousarray(rows)).to(view.device))
    else:
        np.asarray(view)[phys] = rows


def buffer_copy(pool) -> np.ndarray | None:
    """A host copy of the pool's whole byte buffer (None when it keeps none)."""
    return None if pool.buffer is None else host(pool.buffer).copy()


class HostEvents:
    """A backend whose forward events the harness fires itself.

    Delegates everything to `backend` except events: `new_event` gives a
    `SimEvent` that completes only when the harness fires it (or the pool
    waits on it), so the core's hazard rules face a forward that is really
    still running. A real device event would complete at once: no forward
    runs on the device in a test. Use it to run the conformance rules on a
    `CudaBackend`; the buffer, tables and kernels stay the backend's own.

    Args:
        backend: the backend to wrap (its events are not used).
    """

    def __init__(self, backend) -> None:
        self.inner = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"HostEvents({self.inner!r})"

    def new_event(self, label: str = "") -> SimEvent:
        return SimEvent(label)

    def event_done(self, event: SimEvent) -> bool:
        return event.query()

    def wait_event(self, event: SimEvent) -> None:
        """A wait on an unfinished forward finishes it at this point of
        program order (as on the sim backend)."""
        event.synchronize()
