"""Host planning of a page-move batch whose sources and destinations overlap.

Contract to keep: the result is as if every source were read before any
destination is written. Move j must wait for move i when `dst[j] == src[i]`
(j overwrites what i reads). With unique sources and destinations these
waits form disjoint chains and cycles; a move's *level* is its distance from
the head of its chain (a head overwrites no source).

- **Waves.** All moves of one level are a disjoint batch: one launch per
  level, no extra traffic. An ordered shift by d pages of n pages has n/d
  levels, so waves suit long shifts.
- **Staged rounds.** Consecutive levels run as one round: every move whose
  source a later move of the same round overwrites is copied to temp rows
  first. Three launches per round (stage, unstage, direct) whatever the
  shift; rounds split only when the staged rows exceed the temp buffer. The
  price is 2x traffic on staged pages, so short shifts (d = 1) use this.
- **Cycles** (a permutation of pages among themselves; the allocator never
  makes one, the contract allows it): the general chain planner stashes one
  source per cycle before anything is written.

Pure numpy / Python: no torch, no device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_WAVES = 8  # always prefer waves up to this many levels
WAVE_BYTES = 32 << 20  # staged bytes one extra launch is worth (~10 us at ~3 TB/s)


@dataclass(frozen=True)
class Copy:
    """One launch: rows of `src_kind` -> rows of `dst_kind`; a kind is
    "buffer", "temp" (this round's staging rows) or "stash" (sources of moves
    that close a cycle, saved before anything is written)."""

    src_kind: str
    src_rows: np.ndarray
    dst_kind: str
    dst_rows: np.ndarray


def plan_moves(src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray, max_stage_rows: int,
               page_bytes: int = 0) -> list[Copy]:
    """Launches that copy `src[i] -> dst[i]` as if all sources were read first.

    Args:
        src, dst: page indices (host ints or int64 arrays).
        max_stage_rows: most temp rows one staged round may use (>= 1).
        page_bytes: for the waves-or-staging choice (0: waves only up to
            `MAX_WAVES` levels).
    Raises:
        ValueError: for a repeated destination, or a repeated source when
            sources and destinations overlap.
    """
    return _plan_arrays(np.asarray(src, dtype=np.int64).reshape(-1),
                        np.asarray(dst, dtype=np.int64).reshape(-1), max_stage_rows, page_bytes)


def _plan_arrays(src: np.ndarray, dst: np.ndarray, max_stage_rows: int, page_bytes: int) -> list[Copy]:
    """`plan_moves` over int64 [n] arrays."""
    n = src.size
    if _repeats(np.sort(dst)):
        raise ValueError("move_pages: dst repeats a page; each destination must be written once")
    by_src = np.argsort(src)
    sorted_src = src[by_src]
    at = np.minimum(np.searchsorted(sorted_src, dst), max(n - 1, 0))
    hit = sorted_src[at] == dst if n else np.zeros(0, dtype=bool)
    if not hit.any():
        return [Copy("buffer", src, "buffer", dst)]
    if _repeats(sorted_src):
        raise ValueError("move_pages: src repeats a page while sources and destinations overlap")
    pred = np.where(hit, by_src[at], -1)  # pred[j]: the move whose source j overwrites
    level = _levels(pred)
    if level is None:  # cycles
        return _general_plan(src.tolist(), dst.tolist(), max_stage_rows)
    levels = int(level.max()) + 1
    staged = np.zeros(n, dtype=bool)
    staged[pred[pred >= 0]] = True  # moves whose source some move overwrites
    wave_cap = max(MAX_WAVES, 2 * int(staged.sum()) * page_bytes // WAVE_BYTES)
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(levels + 1))
    if levels <= wave_cap:
        return [Copy("buffer", src[order[a:b]], "buffer", dst[order[a:b]]) for a, b in zip(bounds, bounds[1:])]
    return _staged_rounds(src, dst, order, bounds, staged, max_stage_rows)


def _repeats(sorted_pages: np.ndarray) -> bool:
    return bool((sorted_pages[1:] == sorted_pages[:-1]).any())


def _levels(pred: np.ndarray):
    """Each move's distance from its chain head (pointer jumping), or None
    when some moves lie on a cycle."""
    level = (pred >= 0).astype(np.int64)
    anc = pred.copy()
    for _ in range(int(pred.size).bit_length() + 1):
        live = anc >= 0
        if not live.any():
            return level
        up = anc[live]
        level[live] += level[up]
        anc[live] = anc[up]
    return None if (anc >= 0).any() else level


def _staged_rounds(src, dst, order, bounds, staged, max_stage_rows) -> list[Copy]:
    """Rounds of consecutive levels; inside a round, a move is staged when
    its overwriter is in the same round (i.e. not on the round's last level)."""
    levels = len(bounds) - 1
    cum = np.cumsum(np.add.reduceat(staged[order].astype(np.int64), bounds[:-1]))
    plan: list[Copy] = []
    lo = 0
    while lo < levels:
        # Largest hi with the staged rows of levels lo .. hi-2 within the cap.
        base = cum[lo - 1] if lo else 0
        last_inner = int(np.searchsorted(cum, base + max_stage_rows, side="right")) - 1
        hi = min(levels, max(lo + 1, last_inner + 2))
        moves = order[bounds[lo]:bounds[hi]]
        inner = moves[: bounds[hi - 1] - bounds[lo]]  # all levels but the round's last
        stage = inner[staged[inner]]
        direct = np.setdiff1d(moves, stage, assume_unique=True)
        if stage.size:
            temp = np.arange(stage.size, dtype=np.int64)
            plan += [Copy("buffer", src[stage], "temp", temp), Copy("temp", temp, "buffer", dst[stage])]
        plan.append(Copy("buffer", src[direct], "buffer", dst[direct]))
        lo = hi
    return plan


# -- general planner (cycles) --


def _general_plan(src: list[int], dst: list[int], max_stage_rows: int) -> list[Copy]:
    """Chains walked from their heads, cycles opened by stashing the source
    of their last move; rounds stage what the same round overwrites."""
    src_pos = {p: i for i, p in enumerate(src)}
    order, stashed = _chain_order(src, dst, src_pos)
    arr = lambda xs: np.asarray(xs, dtype=np.int64)  # noqa: E731
    plan = []
    if stashed:
        plan.append(Copy("buffer", arr([src[i] for i in stashed]), "stash", np.arange(len(stashed))))
    for chunk, staged in _rounds(order, dst, src_pos, max_stage_rows):
        direct = [i for i in chunk if i not in staged]
        if staged:
            rows = np.arange(len(staged))
            staged = sorted(staged)
            plan.append(Copy("buffer", arr([src[i] for i in staged]), "temp", rows))
            plan.append(Copy("temp", rows, "buffer", arr([dst[i] for i in staged])))
        if direct:
            plan.append(Copy("buffer", arr([src[i] for i in direct]), "buffer", arr([dst[i] for i in direct])))
    if stashed:
        plan.append(Copy("stash", np.arange(len(stashed)), "buffer", arr([dst[i] for i in stashed])))
    return plan


def _chain_order(src, dst, src_pos) -> tuple[list[int], list[int]]:
    """Moves in an order where each waits only for earlier ones, and the
    cycle-closing moves (left out of the order, their sources stashed)."""
    n = len(src)
    writer = {p: j for j, p in enumerate(dst)}  # page -> move that writes it
    waited = [p in src_pos for p in dst]  # move j overwrites some move's source
    seen = [False] * n
    order: list[int] = []
    stashed: list[int] = []

    def walk(i):
        last = i
        while i is not None and not seen[i]:
            seen[i] = True
            order.append(i)
            last = i
            i = writer.get(src[i])
        return last

    for i in range(n):
        if not waited[i]:
            walk(i)
    for i in range(n):
        if not seen[i]:  # on a cycle: run it open, its last move from the stash
            stashed.append(walk(i))
            order.pop()
    return order, stashed


def _rounds(order, dst, src_pos, max_stage_rows):
    """Split `order` into rounds whose staged sources fit `max_stage_rows`;
    yields (moves, staged moves) per round."""
    chunk: list[int] = []
    members: set[int] = set()
    staged: list[int] = []
    for j in order:
        pred = src_pos.get(dst[j])  # the move whose source j overwrites
        if pred in members and len(staged) >= max_stage_rows:
            yield chunk, set(staged)
            chunk, members, staged = [], set(), []
        if pred in members:
            staged.append(pred)
        chunk.append(j)
        members.add(j)
    if chunk:
        yield chunk, set(staged)
