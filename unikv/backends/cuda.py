"""The CUDA backend: a real byte buffer, Triton table and move kernels, CUDA events.

The allocator decides on the host (`unikv.tables`); this backend mirrors the
page tables on the device (one upload + one scatter launch per commit),
moves pages with the Triton move kernel and translates ids on the device.
Triton is imported when the backend is built, never by `import
unikv.backends`. Without Triton the backend still runs, on the torch
versions of its kernels (`unikv.kernels.<operator>.reference`). On a CPU device
(`CudaBackend(device="cpu")`) the Triton launchers run their kernels through
Triton's interpreter when the process imported Triton with
`TRITON_INTERPRET=1`, else the torch references; events are then always done.
That CPU mode exists so the backend's kernel path is testable without a GPU.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # the base install has no torch; name the extra that brings it
    raise ImportError("the CUDA backend needs torch (and triton for its kernels): "
                      "pip install 'unikv[cuda]'") from None


def _kernel_ops() -> SimpleNamespace:
    """The Triton launchers, or torch fallbacks when Triton is missing."""
    try:
        from unikv.kernels.move import kernel as move_kernel
        from unikv.kernels.translate import kernel as translate_kernel
    except ImportError:
        from unikv.kernels.move import reference as move_reference
        from unikv.kernels.translate import reference as translate_reference

        def move(buffer, page_bytes, src, dst, disjoint=None):
            move_reference.move_pages(buffer, page_bytes, src, dst)

        return SimpleNamespace(triton=False, translate=translate_reference.translate, move_pages=move)
    return SimpleNamespace(triton=True, translate=translate_kernel.translate, move_pages=move_kernel.move_pages)


def _put(table: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> None:
    """`table[i] = v` on the device (see `CudaBackend.scatter`)."""
    if torch.are_deterministic_algorithms_enabled():
        table.index_put_((i,), v)
    else:
        table.put_(i, v)


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
            with the same stream you pass here. For page moves that run
            beside the forward, the forward's stream should outrank this one
            when the block scheduler picks between them: CUDA ranks a lower
            priority number higher, and torch's default (0) is already the
            lowest, so give the FORWARD a stream made with
            `torch.cuda.Stream(priority=-1)` (or lower) and this one the default.
        move_programs: the most programs (CTAs) one page-move launch runs
            (`unikv.kernels.move.kernel.move_pages`' `max_programs`): a
            small bound keeps a side-stream move to a few SMs so the forward
            keeps the rest; None (default) launches one program per tile,
            which takes the whole GPU until the move ends. Ignored when
            Triton is missing (the torch fallback copies).
    Raises:
        ValueError: for a device that is neither CUDA nor CPU, a CUDA
            device when CUDA is not available, a stream on a CPU device, or
            a `move_programs` that is not a positive int or None.
    """

    materialized = True
    shares_host_memory = False
    native_ids = "torch"  # the engine that drives a CUDA pool holds torch tensors

    def __init__(self, device: str | torch.device = "cuda", stream: Any | None = None, *,
                 move_programs: int | None = None) -> None:
        if move_programs is not None and (type(move_programs) is not int or move_programs <= 0):
            raise ValueError(f"CudaBackend: move_programs={move_programs!r} must be a positive int or None")
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
        self.move_programs = move_programs
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

    def mirror(self, host: np.ndarray) -> torch.Tensor:
        """A device copy of the host table arena (separate memory, also on a
        CPU device, so the commit path is exercised there too)."""
        with self._on_stream():
            return torch.from_numpy(host).to(self.device, copy=True)

    def upload(self, values: np.ndarray) -> torch.Tensor:
        """Host int64 values -> device, asynchronously (see `_upload`)."""
        return self._upload(values)[0]

    def _upload(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """Equal-length int64 host arrays in one copy; returns their device
        rows. The copy is asynchronous with respect to the device: the CUDA
        driver stages pageable host memory before returning (no stream or
        device wait; on the H200 host 7 us for 256 ids, against 19 us for a
        pinned staging block built per call)."""
        if len(arrays) == 1:
            return [self._to_device(np.ascontiguousarray(arrays[0], dtype=np.int64), fresh=False)]
        # One concatenation builds the block (a fresh array) in one numpy call.
        block = np.concatenate(arrays, dtype=np.int64).reshape(len(arrays), -1)
        return list(self._to_device(block, fresh=True).unbind(0))

    def _to_device(self, host: np.ndarray, fresh: bool) -> torch.Tensor:
        """A contiguous int64 host array on the device; `fresh`: the array is
        the caller's own scratch (a CPU "device" may then alias it)."""
        t = torch.from_numpy(host)
        if self.cuda:
            if self.stream is None:
                return t.to(self.device, non_blocking=True)
            with torch.cuda.stream(self.stream):
                return t.to(self.device, non_blocking=True)
        return t if fresh else t.clone()  # a CPU "device": never alias the caller's host arrays

    def scatter(self, table: torch.Tensor, idx: np.ndarray, values: np.ndarray) -> None:
        """`table[idx] = values` on a 1-D table: one upload of both arrays
        and one torch `put_` (flat indices; on a CPU device a third of the
        host time of `index_put_`, which sets up advanced indexing; a
        Triton launch of the same scatter cost ~25 us of host time on the
        H200). Under `torch.use_deterministic_algorithms`, which refuses
        `put_`, an `index_put_`. Repeated indices carry equal values (the
        commit reads them from the host arena), so their order does not
        matter."""
        if len(idx) == 0:
            return
        i, v = self._upload(idx, values)
        if self.stream is None:
            _put(table, i, v)
            return
        with torch.cuda.stream(self.stream):
            _put(table, i, v)

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

    def move_pages(self, buffer, page_bytes: int, src: np.ndarray, dst: np.ndarray,
                   disjoint: bool | None = None) -> None:
        """Copy page rows `src -> dst` (see `unikv.kernels.move.kernel`); the
        page lists travel in one upload, and an overlapping move is planned
        from the host lists (no device read). Each launch runs on at most
        `move_programs` programs when the backend was built with it."""
        if buffer is None or len(src) == 0:
            return
        s, d = self._upload(src, dst)
        with self._on_stream():
            if self.ops.triton:  # the planner reads the host lists: no device read
                self.ops.move_pages(buffer, page_bytes, s, d, disjoint=disjoint, host_pages=(src, dst),
                                    max_programs=self.move_programs)
            else:
                self.ops.move_pages(buffer, page_bytes, s, d, disjoint=disjoint)

    def translate(self, v_tokens, v2p, page_size: int, multiplier: int = 1) -> torch.Tensor:
        with self._on_stream():
            return self.ops.translate(v_tokens, v2p, page_size, multiplier)
