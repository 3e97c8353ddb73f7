"""Virtual id spaces the pool owns, and argument checks for ids."""

from __future__ import annotations

from typing import Sequence

import torch


class IdSpace:
    """Virtual page ids `1..size-1` (0 is the sink) with a bind count each.

    An id is live while at least one band binds it; it returns to the free
    list when the last band lets go. The free list is a preallocated stack,
    so taking and returning `k` ids costs O(k) whatever the id space size.
    """

    def __init__(self, backend, size: int, holders: int) -> None:
        self.backend = backend
        self.size = size
        self.holders = holders
        self.reset()

    def reset(self) -> None:
        # Stored descending so the first takes hand out 1, 2, 3, ...
        self._stack = torch.flip(self.backend.arange(1, self.size), (0,))
        self._top = self.size - 1
        self.binds = torch.zeros(self.size, dtype=torch.int16, device=self.backend.device)

    @property
    def free(self) -> torch.Tensor:
        """The free ids (a view, next-to-take last)."""
        return self._stack[: self._top]

    @property
    def free_count(self) -> int:
        return self._top

    def take(self, n: int) -> torch.Tensor:
        """The next `n` free ids, bound on all holders. Caller checked n fits."""
        if n > self._top:
            raise RuntimeError(f"internal: took {n} ids with {self._top} free")
        ids = torch.flip(self._stack[self._top - n: self._top], (0,))
        self._top -= n
        self.binds.index_fill_(0, ids, self.holders)  # no host scalar crosses to the device
        return ids

    def _push(self, ids: torch.Tensor) -> None:
        k = int(ids.numel())
        self._stack[self._top: self._top + k] = ids
        self._top += k

    def drop(self, ids: torch.Tensor) -> None:
        """One holder lets go of each of `ids`; ids nobody holds come back."""
        if ids.numel() == 0:
            return
        self.binds[ids] -= 1
        self._push(ids[self.binds[ids] == 0])

    def drop_all(self, ids: torch.Tensor) -> None:
        """Every holder lets go of `ids` (unique)."""
        self.binds.index_fill_(0, ids, 0)
        self._push(ids)

    def live_count(self) -> int:
        return int((self.binds > 0).sum())

    def violations(self, name: str) -> list[str]:
        out = []
        free = self.free
        if int(free.numel()) != int(torch.unique(free).numel()):
            out.append(f"[{name} ids] an id is on the free list twice")
        if free.numel() and bool((self.binds[free] != 0).any()):
            out.append(f"[{name} ids] a free id is still bound")
        if free.numel() + self.live_count() != self.size - 1:
            out.append(
                f"[{name} ids] free {free.numel()} + live {self.live_count()} "
                f"!= {self.size - 1} ids"
            )
        return out


def as_ids(values, what: str, device) -> torch.Tensor:
    """`values` (tensor, sequence or int) as a 1-D int64 tensor on `device`.

    Raises:
        ValueError: naming `what`, for a non-integer dtype or a >1-D shape.
    """
    if isinstance(values, torch.Tensor):
        t = values
    else:
        try:
            t = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{what}: cannot read {values!r} as integer ids ({exc})") from None
        if t.numel() == 0:
            t = t.to(torch.int64)  # an empty sequence carries no dtype
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{what}: dtype {t.dtype} is not an integer dtype")
    if t.dim() > 1:
        raise ValueError(f"{what}: shape {tuple(t.shape)} is not 1-D")
    return t.reshape(-1).to(device=device, dtype=torch.int64)


def check_range(ids: torch.Tensor, low: int, high: int, what: str) -> None:
    """Every id in `[low, high)`, else ValueError listing a few offenders."""
    if ids.numel() == 0:
        return
    lo, hi = torch.aminmax(ids)
    if int(lo) >= low and int(hi) < high:
        return
    bad = ids[(ids < low) | (ids >= high)]
    raise ValueError(f"{what}: ids {_few(bad)} are outside [{low}, {high})")


def check_count(n, what: str, multiple: int = 1) -> int:
    """A non-negative int that is a multiple of `multiple`."""
    if isinstance(n, bool) or not isinstance(n, int) and not (
        isinstance(n, torch.Tensor) and n.dim() == 0 and not n.dtype.is_floating_point
    ):
        raise ValueError(f"{what}={n!r} must be an integer")
    n = int(n)
    if n < 0:
        raise ValueError(f"{what}={n} must be >= 0")
    if n % multiple:
        raise ValueError(f"{what}={n} must be a multiple of page_size={multiple}")
    return n


def _few(t: torch.Tensor, k: int = 8) -> str:
    vals = t.tolist()
    more = f" (+{len(vals) - k} more)" if len(vals) > k else ""
    return f"{vals[:k]}{more}"


def few(values: Sequence[int] | torch.Tensor, k: int = 8) -> str:
    """A short rendering of offending ids for error messages."""
    return _few(values if isinstance(values, torch.Tensor) else torch.tensor(list(values)), k)
