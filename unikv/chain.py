"""The chain: the bands in byte order, their walks, capacity views, checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unikv.extent import (
    Extent,
    Kind,
    after_urgent_flush,
    chain_gap_bytes,
    extension_room,
    joint_pages,
    take_all,
)
from unikv.hazards import Epoch
from unikv.layout import Layout


class EpochMemo:
    """Answers keyed by what they answer, each fresh while the chain-wide
    epoch has not moved since it was computed (`hazards.Epoch`)."""

    def __init__(self, epoch: Epoch) -> None:
        self.epoch = epoch
        self.entries: dict[tuple, tuple[int, int]] = {}  # key -> (epoch, value)

    def get(self, key: tuple, compute: Callable[[], int]) -> int:
        """The fresh answer for `key`, computing (and keeping) it if none."""
        hit = self.entries.get(key)
        if hit is not None and hit[0] == self.epoch.value:
            return hit[1]
        value = compute()
        self.entries[key] = (self.epoch.value, value)
        return value

    def fresh(self, key: tuple) -> int | None:
        """The answer for `key` if it is fresh, else None (nothing computed)."""
        hit = self.entries.get(key)
        return hit[1] if hit is not None and hit[0] == self.epoch.value else None

    def last(self, key: tuple) -> int:
        """The last answer for `key`, fresh or not (0 if none): a search's
        starting point, never its result."""
        return self.entries.get(key, (None, 0))[1]

    def current(self) -> list[tuple[tuple, int]]:
        """Every fresh `(key, answer)`."""
        now = self.epoch.value
        return [(k, v) for k, (e, v) in self.entries.items() if e == now]

    def clear(self) -> None:
        self.entries.clear()


class Chain:
    """Bands ordered low byte -> high byte, sharing one mutation epoch.

    Capacity views are memoised on the epoch: any band mutation bumps it, so
    a memo is fresh exactly while nothing has changed. The chain computes
    the views of its own arithmetic; `memo` also keeps answers its owner
    computes (the pool's ladder view) under keys of the owner's, so one
    `forget_memos` forgets them all.
    """

    def __init__(self, layout: Layout, epoch: Epoch) -> None:
        self.total_bytes = layout.total_bytes
        self.sink_bytes = layout.sink_bytes
        self.epoch = epoch
        self.bands: list = []
        # (bands, float index, the other indices), computed once per band list
        self._float: tuple[list | None, int | None, tuple[int, ...]] = (None, None, ())
        self.memo = EpochMemo(epoch)
        # (epoch, extents, schedulable extents or None until asked)
        self._extents: tuple[int, tuple[Extent, ...], tuple[Extent, ...] | None] | None = None

    def extents(self, schedulable: bool = False) -> tuple[Extent, ...]:
        """Every band's extent, memoised per epoch (a tuple: callers that
        edit it take a list copy); `schedulable` pretends lazy END bands
        were urgently flushed (their holes reclaimed at the frontier)."""
        memo = self._extents
        if memo is None or memo[0] != self.epoch.value:
            memo = self._extents = (self.epoch.value, tuple([b.extent() for b in self.bands]), None)
        if not schedulable:
            return memo[1]
        if memo[2] is None:
            flushed = tuple([after_urgent_flush(e) for e in memo[1]])
            self._extents = (memo[0], memo[1], flushed)
            return flushed
        return memo[2]

    def float_index(self) -> int | None:
        """Index of the float band (None if the chain has none)."""
        bands, index, _ = self._float
        if bands is not self.bands:  # computed once per band list
            index = self._index_bands()
        return index

    def non_float_indices(self) -> tuple[int, ...]:
        """Indices of every band but the float, in chain order."""
        bands, _, others = self._float
        if bands is not self.bands:
            self._index_bands()
            others = self._float[2]
        return others

    def _index_bands(self) -> int | None:
        index = next((i for i, b in enumerate(self.bands) if b.kind is Kind.FLOAT), None)
        others = tuple(i for i in range(len(self.bands)) if i != index)
        self._float = (self.bands, index, others)
        return index

    # -- capacity --

    def joint_pages(self, order: Sequence[int], schedulable: bool = False) -> int:
        """Pages a coupled take on every band of `order` gets without a move."""
        key = ("joint", tuple(order), schedulable)
        hint = self.memo.last(key)  # the last answer: the search gallops from it
        return self.memo.get(
            key, lambda: joint_pages(self.extents(schedulable), order, self.total_bytes, hint))

    def fits_joint(self, order: Sequence[int], pages: int) -> bool:
        """Whether `pages` pages fit on every band of `order` without a move
        (one feasibility walk: cheaper than the full capacity search)."""
        known = self.memo.fresh(("joint", tuple(order), False))
        if known is not None:
            return pages <= known
        return take_all(self.extents(), order, pages, self.total_bytes) is not None

    def band_pages(self, i: int, schedulable: bool = False) -> int:
        """Pages one take on band `i` alone gets without a move."""
        def compute() -> int:
            ext = self.extents(schedulable)
            return ext[i].holes + extension_room(ext, i, self.total_bytes)
        return self.memo.get(("band", i, schedulable), compute)

    def memo_violations(self) -> list[str]:
        """A memo of the chain's own views ("joint", "band") of the current
        epoch must equal a fresh recompute (its owner checks the others)."""
        out = []
        now = tuple(b.extent() for b in self.bands)  # fresh, bypassing every memo
        after = tuple(after_urgent_flush(e) for e in now)
        memo = self._extents
        if memo is not None and memo[0] == self.epoch.value and (
                memo[1] != now or memo[2] not in (None, after)):
            out.append("[chain] stale extents memo")
        for key, value in self.memo.current():
            if key[0] not in ("joint", "band"):
                continue
            ext = after if key[2] else now
            if key[0] == "joint":
                fresh = joint_pages(ext, key[1], self.total_bytes)
            else:
                fresh = ext[key[1]].holes + extension_room(ext, key[1], self.total_bytes)
            if fresh != value:
                out.append(f"[chain] stale capacity memo {key}: cached {value}, actual {fresh}")
        return out

    # -- applying plans --

    def flush_bands(self, indices: Sequence[int], urgent: bool) -> int:
        """Flush the bands at `indices` (a policy's pick); returns page moves."""
        bands, moves = self.bands, 0
        for i in indices:
            moves += bands[i].flush(urgent)
        return moves

    def forget_memos(self) -> None:
        self.memo.clear()
        self._extents = None

    # -- geometry checks and views --

    def gap_bytes(self) -> int:
        return chain_gap_bytes(self.extents(), self.sink_bytes, self.total_bytes)

    def order_violations(self) -> list[str]:
        """Non-transparent bands must not overlap and must stay inside
        `[sink, total_bytes)`."""
        out = []
        frontier, prev = self.sink_bytes, "sink"
        for b, e in zip(self.bands, self.extents()):
            if e.transparent:
                continue
            top = e.cap * e.page_bytes if e.kind is Kind.REGION else e.high_byte
            if e.low_byte < frontier:
                out.append(f"[chain] {b.name} low byte {e.low_byte} overlaps {prev} (ends at {frontier})")
            if top > self.total_bytes or e.low > max(e.high, e.low):
                out.append(f"[chain] {b.name} range [{e.low_byte}, {top}) leaves the buffer")
            frontier, prev = max(frontier, top), b.name
        return out
