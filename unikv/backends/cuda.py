"""The CUDA backend: a real byte buffer, Triton table and move kernels, CUDA events.

Triton is imported when the backend is built, never by `import
unikv.backends`. Without Triton the backend still runs, on torch versions of
every kernel (`reference.py` / `reference.py`). On a CPU device
(`CudaBackend(device="cpu")`) the Triton launchers run their kernels through
Triton's interpreter when the process imported Triton with
`TRITON_INTERPRET=1`, else the torch references; events are then always done.
That CPU mode exists so the backend's kernel path is testable without a GPU.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Optional, Sequence

import torch


def _kernel_ops() -> SimpleNamespace:
    """The Triton launchers, or torch fallbacks when Triton is missing."""
    try:
        from unikv.kernels import triton_move, triton_paged, triton_tables
    except ImportError:
        from unikv.kernels import reference
        from unikv.kernels import reference as extra

        def move(buffer, page_bytes, src, dst, disjoint=None):
            reference.move_pages(buffer, page_bytes, src, dst)

        def extend(prefix, seq, last, pages, page_size, total_tokens=None):
            return extra.paged_extend(prefix, seq, last, pages, page_size, total_tokens)

        return SimpleNamespace(triton=False, bind=reference.bind, alloc_bind=extra.alloc_bind,
                               free_unbind=reference.free_unbind, remap_moved=reference.remap_moved,
                               translate=reference.translate, move_pages=move,
                               paged_extend=extend, paged_decode=extra.paged_decode)
    return SimpleNamespace(triton=True, bind=triton_tables.bind, alloc_bind=triton_tables.alloc_bind,
                           free_unbind=triton_tables.free_unbind, remap_moved=triton_tables.remap_moved,
                           translate=triton_tables.translate, move_pages=triton_move.move_pages,
                           paged_extend=triton_paged.paged_extend, paged_decode=triton_paged.paged_decode)


class DoneEvent:
    """The event of a CPU-device backend: work is done when it is issued."""

    __slots__ = ("label",)

    def __init__(self, label: str = "") -> None:
        self.label = label

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CudaBackend:
    """Backend over a device byte buffer with Triton kernels.

    Args:
        device: a CUDA device ("cuda", "cuda:1", ...); "cpu" runs the same
            kernel path on the CPU (see the module docstring).
        stream: a `torch.cuda.Stream` for the backend's own kernel launches,
            events and stream waits; None uses the current stream at each
            call. The allocator core issues its other torch ops on the
            current stream, so run the pool under `torch.cuda.stream(s)`
            with the same stream you pass here.
    Raises:
        ValueError: for a device that is neither CUDA nor CPU, or a CUDA
            device when CUDA is not available.
    """

    materialized = True

    def __init__(self, device: str | torch.device = "cuda", stream: Optional[Any] = None) -> None:
        dev = torch.device(device)
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"CudaBackend: device={device!r} must be a CUDA device or 'cpu'")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"CudaBackend: device={device!r} but CUDA is not available; "
                                 "use SimBackend, or device='cpu'")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif stream is not None:
            raise ValueError("CudaBackend: stream is only meaningful on a CUDA device")
        self.device = dev
        self.stream = stream
        self.cuda = dev.type == "cuda"
        self.ops = _kernel_ops()

    def __repr__(self) -> str:
        return f"CudaBackend(device={str(self.device)!r}, triton={self.ops.triton})"

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _current_stream(self):
        return self.stream if self.stream is not None else torch.cuda.current_stream(self.device)

    # -- memory --

    def make_buffer(self, total_bytes: int) -> torch.Tensor:
        """An uninitialised uint8 buffer of `total_bytes` on the device."""
        with self._on_stream():
            return torch.empty(total_bytes, dtype=torch.uint8, device=self.device)

    def table(self, size: int) -> torch.Tensor:
        with self._on_stream():
            return torch.full((size,), -1, dtype=torch.int64, device=self.device)

    def ids(self, values: Sequence[int]) -> torch.Tensor:
        """Host ints -> int64 device tensor: a pinned staging copy and an
        asynchronous upload (the caching host allocator keeps the pinned
        block alive until the copy has run)."""
        if isinstance(values, torch.Tensor):
            return values.to(device=self.device, dtype=torch.int64)
        if not self.cuda:
            return torch.tensor(values, dtype=torch.int64)
        if len(values) == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
        with self._on_stream():
            return host.to(self.device, non_blocking=True)

    def arange(self, start: int, end: int) -> torch.Tensor:
        with self._on_stream():
            return torch.arange(start, end, dtype=torch.int64, device=self.device)

    def to_host(self, t: torch.Tensor) -> list[int]:
        """Host copy of an int tensor (a device->host sync on CUDA)."""
        return t.tolist()

    # -- events --

    def new_event(self, label: str = "") -> Any:
        """A CUDA event recorded now on the backend's stream (CPU: done)."""
        if not self.cuda:
            return DoneEvent(label)
        event = torch.cuda.Event()
        event.record(self._current_stream())
        return event

    def event_done(self, event: Any) -> bool:
        """Whether `event` has completed (a query, never a wait)."""
        return bool(event.query())

    def wait_event(self, event: Any) -> None:
        """Order later work on the stream after `event`: a stream wait, the
        host does not block."""
        if self.cuda:
            self._current_stream().wait_event(event)
        elif hasattr(event, "synchronize"):
            event.synchronize()

    # -- kernels --

    def bind(self, v_pages, p_pages, v2p, p2v) -> None:
        with self._on_stream():
            self.ops.bind(v_pages, p_pages, v2p, p2v)

    def alloc_bind(self, v_pages, start, v2p, p2v) -> torch.Tensor:
        """Bind `v_pages` to fresh physical pages `[start, start + n)` in one
        launch; returns those pages."""
        with self._on_stream():
            return self.ops.alloc_bind(v_pages, start, v2p, p2v)

    def free_unbind(self, v_pages, v2p, p2v) -> torch.Tensor:
        with self._on_stream():
            return self.ops.free_unbind(v_pages, v2p, p2v)

    def remap_moved(self, src, dst, v2p, p2v) -> torch.Tensor:
        with self._on_stream():
            return self.ops.remap_moved(src, dst, v2p, p2v)

    def move_pages(self, buffer, page_bytes: int, src, dst, disjoint: Optional[bool] = None) -> None:
        """Copy page rows `src -> dst` (see `triton_move.move_pages`; without
        `disjoint=True` it reads the page lists to the host once)."""
        if buffer is None:
            return
        with self._on_stream():
            self.ops.move_pages(buffer, page_bytes, src, dst, disjoint=disjoint)

    def translate(self, v_tokens, v2p, page_size: int, multiplier: int = 1) -> torch.Tensor:
        with self._on_stream():
            return self.ops.translate(v_tokens, v2p, page_size, multiplier)

    def paged_extend(self, prefix_lens, seq_lens, last_loc, new_pages, page_size: int,
                     total_tokens: Optional[int] = None) -> torch.Tensor:
        with self._on_stream():
            return self.ops.paged_extend(prefix_lens, seq_lens, last_loc, new_pages, page_size,
                                         total_tokens=total_tokens)

    def paged_decode(self, seq_lens, last_loc, new_pages, page_size: int) -> torch.Tensor:
        with self._on_stream():
            return self.ops.paged_decode(seq_lens, last_loc, new_pages, page_size)
