"""Virtual id spaces the pool owns, and argument checks for ids.

Ids are host data: the pool hands out virtual ids it chose on the host and
reads the ids callers pass back on the host. A CPU tensor, a numpy array or
a list costs no device round trip; a device tensor is read back (one
device-to-host copy), so engines that want a sync-free step keep their
virtual ids on the host.

Torch is optional: a tensor can only reach these checks once its caller
imported torch, so they look for `torch.Tensor` only then (`loaded_torch`)
and never import torch themselves.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

SMALL = 4  # up to this many ids, per-id Python steps are cheaper than numpy calls


class IdSpace:
    """Virtual page ids `1..size-1` (0 is the sink) with a bind count each.

    An id is live while at least one band binds it; it returns to the free
    list when the last band lets go. The free list is a preallocated stack,
    so taking and returning `k` ids costs O(k) whatever the id space size.
    """

    def __init__(self, size: int, holders: int) -> None:
        self.size = size
        self.holders = holders
        self.reset()

    def reset(self) -> None:
        # Stored descending so the first takes hand out 1, 2, 3, ...
        self._stack = np.arange(self.size - 1, 0, -1, dtype=np.int64)
        self._top = self.size - 1
        self.binds = np.zeros(self.size, dtype=np.int16)

    @property
    def free(self) -> np.ndarray:
        """The free ids (a view, next-to-take last)."""
        return self._stack[: self._top]

    @property
    def free_count(self) -> int:
        return self._top

    def take(self, n: int) -> np.ndarray:
        """The next `n` free ids, bound on all holders."""
        if n > self._top:
            raise RuntimeError(f"internal: {n} ids taken with {self._top} free")
        top = self._top
        # next-to-take last: reversed, but one id needs no reversing
        ids = self._stack[top - 1: top].copy() if n == 1 else self._stack[top - n: top][::-1].copy()
        self._top -= n
        self.binds[ids] = self.holders
        return ids

    def _push(self, ids: np.ndarray) -> None:
        k = len(ids)
        if k:  # often none: a window release leaves the ids bound on the other bands
            self._stack[self._top: self._top + k] = ids
            self._top += k

    def drop(self, ids: np.ndarray | list[int]) -> None:
        """One holder lets go of each of `ids` (unique; an int64 array, or a
        list of at most `SMALL` ints); ids nobody holds come back."""
        if len(ids) == 0:
            return
        if len(ids) <= SMALL:  # a few ids: Python steps beat numpy calls
            binds, stack = self.binds, self._stack
            for v in ids if isinstance(ids, list) else ids.tolist():
                left = binds[v] - 1
                binds[v] = left
                if left == 0:
                    stack[self._top] = v
                    self._top += 1
            return
        left = self.binds[ids] - 1
        self.binds[ids] = left
        self._push(ids[left == 0])

    def drop_all(self, ids: np.ndarray) -> None:
        """Every holder lets go of `ids` (unique)."""
        self.binds[ids] = 0
        self._push(ids)

    def live_count(self) -> int:
        return int(np.count_nonzero(self.binds[1:]))

    def violations(self, name: str) -> list[str]:
        out = []
        free = self.free
        if len(free) != len(np.unique(free)):
            out.append(f"[{name} ids] an id is on the free list twice")
        if len(free) and bool((self.binds[free] != 0).any()):
            out.append(f"[{name} ids] a free id is still bound")
        if len(free) + self.live_count() != self.size - 1:
            out.append(
                f"[{name} ids] free {len(free)} + live {self.live_count()} "
                f"!= {self.size - 1} ids"
            )
        return out


def loaded_torch():
    """The torch module if this process already imported it, else None (a
    value of any other type cannot be a tensor then)."""
    return sys.modules.get("torch")


def is_tensor(value) -> bool:
    """Whether `value` is a torch tensor, without importing torch."""
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.Tensor)


def require_torch(what: str):
    """Import and return torch for `what`, which asked for tensors.

    Raises:
        ImportError: torch is not installed; names the extra that brings it
            and the numpy alternative.
    """
    try:
        import torch
    except ImportError:
        raise ImportError(f"{what} needs torch, which is not installed: "
                          "pip install 'unikv[torch]', or pass ids='numpy'") from None
    return torch


def as_ids(values, what: str) -> np.ndarray:
    """`values` (tensor, array, sequence or int) as a 1-D int64 host array.

    Raises:
        ValueError: naming `what`, for a non-integer dtype or a >1-D shape.
    """
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1:
        return values  # the hot path: the engine's own host arrays
    torch = loaded_torch()
    if torch is not None and isinstance(values, torch.Tensor):
        if values.dtype == torch.int64 and values.dim() == 1 and values.device.type == "cpu":
            return values.numpy()
        dtype = values.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise ValueError(f"{what}: dtype {dtype} is not an integer dtype")
        if values.dim() > 1:
            raise ValueError(f"{what}: shape {tuple(values.shape)} is not 1-D")
        if values.device.type != "cpu":
            values = values.cpu()  # a device read: pass host ids to avoid it
        return values.reshape(-1).numpy().astype(np.int64, copy=False)
    try:
        a = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read {values!r} as integer ids ({exc})") from None
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)  # an empty sequence carries no dtype
    if a.dtype.kind not in "iu":
        raise ValueError(f"{what}: dtype {a.dtype} is not an integer dtype")
    if a.ndim > 1:
        raise ValueError(f"{what}: shape {a.shape} is not 1-D")
    return a.reshape(-1).astype(np.int64, copy=False)


def check_range(ids: np.ndarray, low: int, high: int, what: str) -> None:
    """Every id in `[low, high)`, else ValueError listing a few offenders."""
    if len(ids) == 0:
        return
    if int(ids.min()) >= low and int(ids.max()) < high:
        return
    bad = ids[(ids < low) | (ids >= high)]
    raise ValueError(f"{what}: ids {few(bad)} are outside [{low}, {high})")


def check_count(n, what: str, multiple: int = 1) -> int:
    """A non-negative int that is a multiple of `multiple`."""
    if type(n) is int and n >= 0 and not n % multiple:
        return n  # the hot path: a plain valid int (bool is a subclass, never this type)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) and not _int_scalar_tensor(n):
        raise ValueError(f"{what}={n!r} must be an integer")
    n = int(n)
    if n < 0:
        raise ValueError(f"{what}={n} must be >= 0")
    if n % multiple:
        raise ValueError(f"{what}={n} must be a multiple of page_size={multiple}")
    return n


def _int_scalar_tensor(n) -> bool:
    """Whether `n` is a 0-d integer torch tensor (torch never imported here)."""
    torch = loaded_torch()
    return (torch is not None and isinstance(n, torch.Tensor) and n.dim() == 0
            and not n.dtype.is_floating_point and not n.dtype.is_complex and n.dtype != torch.bool)


def few(values: Sequence[int] | np.ndarray | torch.Tensor, k: int = 8) -> str:
    """A short rendering of offending ids for error messages."""
    vals = values.tolist() if hasattr(values, "tolist") else list(values)
    more = f" (+{len(vals) - k} more)" if len(vals) > k else ""
    return f"{vals[:k]}{more}"
