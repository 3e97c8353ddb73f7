"""The random driver's forwards and capacity probes (a mixin of `Driver`)."""

from __future__ import annotations

import collections
import random
from typing import TYPE_CHECKING

from unikv.testing.device import host_ids
from unikv.testing.forward import Forward, land, plan_io

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool
    from unikv.testing.model import ChainModel, Request
    from unikv.testing.shadow import ShadowBytes


class ForwardsAndProbes:
    """Engine actions that launch and finish forwards, and probe the views."""

    if TYPE_CHECKING:  # what the actions use of `Driver` (all set in its __init__)
        pool: UnifiedPool
        rng: random.Random
        model: ChainModel
        shadow: ShadowBytes
        ps: int
        token_bands: list[str]
        state_bands: list[str]
        forward_delay: int
        ops: int
        last_batch: tuple[list[int], list[int]] | None
        inflight: Forward | None
        pending_violations: list[str]
        counts: collections.Counter[str]
        orphans: dict[str, list[int]]

        @property
        def reqs(self) -> dict[int, Request]: ...
        def log(self, *parts: object) -> None: ...
        def _write(self, band: str, ids: list[int]) -> None: ...
        def _new_tokens(self, rid: int, ids: list[int]) -> None: ...
        def free_request(self, rid: int) -> None: ...
        def free_orphans_ids(self, band: str, ids: list[int]) -> None: ...

    def launch(self, rids: list[int] | None = None, write_ids: list[int] | None = None) -> Forward | None:
        """Declare a forward: it reads every live slot of `rids` and writes
        `write_ids` (default: the last decode / extend batch and the ids it
        allocated). A forward still running is finished first."""
        self.fire()
        if rids is None:
            if self.last_batch is None:
                return None
            owners, ids = self.last_batch
            self.last_batch = None
            # Only ids of requests still live: a freed request's ids may be reused.
            write_ids = [t for r, t in zip(owners, ids) if r in self.reqs]
            rids = [r for r in dict.fromkeys(owners) if r in self.reqs]
        reqs = [self.reqs[r] for r in rids]
        written = host_ids(write_ids or [])
        if not reqs or len(written) == 0:
            return None
        event = self.pool.backend.new_event(f"forward@{self.ops}")
        fwd = Forward(event, fire_at=self.ops + self.rng.randint(1, self.forward_delay))
        toks = [t for r in reqs for t in r.tokens]
        for band in self.token_bands:
            live = self.model.stamps[band]
            plan_io(fwd, self.pool, self.model, self.shadow, band, [t for t in toks if t in live],
                    [t for t in written.tolist() if t in live], self.ps)
        states = {band: [r.states[band] for r in reqs if band in r.states] for band in self.state_bands}
        for band, slots in states.items():
            plan_io(fwd, self.pool, self.model, self.shadow, band, slots, slots, 1)
        fwd.event.on_fire(lambda: self._forward_done(fwd))
        self.inflight = fwd
        self.pool.set_inflight_forward(fwd.event, write_ids=written,
                                       state_write_ids={b: s for b, s in states.items() if s})
        self.log("launch", rids, "writes", len(written), "fires at", fwd.fire_at)
        return fwd

    def fire(self) -> None:
        """Finish the in-flight forward (its writes land now)."""
        if self.inflight is not None:
            self.inflight.event.fire()

    def _forward_done(self, fwd: Forward) -> None:
        """The event fired (from the driver or a settle inside the pool)."""
        self.counts["fired"] += 1
        if self.inflight is fwd:
            self.inflight = None
        self.pending_violations += land(fwd, self.model, self.shadow)

    def probe_available(self, keep: bool = False) -> int | None:
        """Alloc exactly `available_size()` tokens: it must fit and move no
        page. Frees it again unless `keep`. Returns the request id."""
        n = self.pool.available_size()
        if n % self.ps:
            self.pending_violations.append(f"available_size() {n} is not a multiple of {self.ps}")
        if n == 0 or n % self.ps:
            return None
        moves = self.pool.stats()["moves"]
        out = self.pool.alloc(n)
        if out is None:
            self.pending_violations.append(f"alloc(available_size()={n}) returned None")
            return None
        if self.pool.stats()["moves"] != moves:
            self.pending_violations.append(f"alloc(available_size()={n}) moved pages")
        rid = self.model.new_request()
        self._new_tokens(rid, host_ids(out).tolist())
        self.log("probe alloc", rid, n)
        if not keep:
            self.free_request(rid)
        return rid

    def probe_state(self, band: str, keep: bool = False) -> list[int] | None:
        """Alloc exactly `available_state(band)` slots: it must fit and move
        no page. Frees them again unless `keep`."""
        n = self.pool.available_state(band)
        if n == 0:
            return None
        moves = self.pool.stats()["moves"]
        ids = self.pool.alloc_state(band, n)
        if ids is None:
            self.pending_violations.append(f"alloc_state({band!r}, available_state()={n}) returned None")
            return None
        if self.pool.stats()["moves"] != moves:
            self.pending_violations.append(f"alloc_state({band!r}, available_state()={n}) moved pages")
        got = host_ids(ids).tolist()
        self.orphans[band] += got
        self._write(band, got)
        self.log("probe alloc_state", band, n)
        if not keep:
            self.free_orphans_ids(band, got)
        return got
