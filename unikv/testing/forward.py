"""The forward model the harness plays: one forward in flight, its reads and
writes planned at the physical slots its ids translate to at launch.

When its event fires (from the harness, or from a settle inside the pool)
`land` checks that the slots it read still hold what they held at launch
(the read hazard: a vacated page reused too early) and lands its writes at
the launch-time slots (the write hazard: a written page moved before the
forward finished leaves stale bytes at its new home).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from unikv.testing.device import host_ids
from unikv.testing.model import ChainModel
from unikv.testing.shadow import ShadowBytes

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool

# (band, virtual page or state slot) a forward touches.
Pair = tuple[str, int]


class ForwardEvent(Protocol):
    """A forward's done event as the harness drives it (a `SimEvent`, also
    under `HostEvents` on a device backend)."""

    def on_fire(self, fn: Callable[[], None]) -> None:
        """Call `fn` when the event fires."""

    def fire(self) -> None:
        """Finish the forward now (its callbacks run)."""


@dataclass
class Forward:
    """A launched forward.

    Attributes:
        event: its done event (the harness fires it).
        touched: (token band, virtual page) and (state band, slot) pairs it
            reads or writes; the engine never frees or releases them first.
        reads: (band, virtual ids, launch-time physical slots, rows expected).
        writes: (band, virtual ids, launch-time physical slots, stamps).
        fire_at: the random driver's op count at which it fires (None: a
            rule fires it).
    """

    event: ForwardEvent
    touched: set[Pair] = field(default_factory=set)
    reads: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    writes: list[tuple[str, np.ndarray, np.ndarray | None, list[int]]] = field(default_factory=list)
    fire_at: int | None = None

    def touches(self, pairs: Iterable[Pair]) -> bool:
        """Whether it touches any (band, page or slot) pair of `pairs`."""
        return not self.touched.isdisjoint(pairs)

    def touches_pages(self, pages: Iterable[int], token_bands: Collection[str]) -> bool:
        """Whether it touches any virtual page of `pages` on any token band."""
        wanted = set(pages)
        return any(v in wanted for b, v in self.touched if b in token_bands)


def plan_io(fwd: Forward, pool: UnifiedPool, model: ChainModel, shadow: ShadowBytes, band: str,
            reads, writes, page_size: int) -> None:
    """Add the forward's reads and writes of `band` (virtual token ids, or
    slots with `page_size` 1): their pairs, launch-time slots, the bytes
    the reads expect, fresh stamps for the writes."""
    reads, writes = host_ids(reads), host_ids(writes)
    fwd.touched |= {(band, int(t) // page_size) for t in reads}
    if shadow.materialized and len(reads):
        fwd.reads.append((band, reads, host_ids(pool.translate(reads, band)), shadow.expected(band, reads)))
    if len(writes):
        phys = host_ids(pool.translate(writes, band)) if shadow.materialized else None
        fwd.writes.append((band, writes, phys, model.new_stamps(len(writes))))


def land(fwd: Forward, model: ChainModel, shadow: ShadowBytes) -> list[str]:
    """The event fired: read-hazard violations of the forward's reads, then
    its writes land (buffer, shadow, model stamps)."""
    out: list[str] = []
    for band, ids, phys, rows in fwd.reads:
        got = shadow.read(band, phys)
        if not np.array_equal(got, rows):
            bad = (got != rows).any(1)
            out.append(f"[{band}] read hazard: slots {phys[bad][:8].tolist()} (virtual "
                       f"{ids[bad][:8].tolist()}) changed while the forward read them")
    for band, ids, dst, stamps in fwd.writes:  # dst: None on an unmaterialised shadow
        shadow.write(band, ids, dst, stamps)
        model.write(band, ids.tolist(), stamps)
    return out
