"""The random operation mix of `Driver.step()` (a mixin of `Driver`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unikv.testing.model import Request

DEFAULT_WEIGHTS = {
    "new": 10.0,  # admit 1-3 requests through alloc_extend (prefix 0)
    "new_alloc": 3.0,  # admit one request through plain alloc
    "extend": 10.0,  # chunked prefill of 1-3 live requests (tail-page reuse)
    "decode": 25.0,  # one token for each of a batch of live requests
    "ratchet": 8.0,  # release window-band pages that left the window
    "free": 8.0,  # finish a request (free + free_state)
    "state": 4.0,  # alloc / free state slots not owned by a request
    "flush": 6.0,
    "make_room": 2.0,
    "compact": 2.0,
    "launch": 8.0,  # declare a forward (it fires a few ops later)
    "clear": 0.05,
    "avail": 2.0,  # alloc exactly available_size() / available_state(): must fit, no move
}


class RandomOps:
    """`op_*` methods: draw arguments from `self.rng`, call an engine action."""

    if TYPE_CHECKING:  # what the typed helpers use of `Driver` (all set in its __init__)
        rng: random.Random
        max_new_tokens: int
        disabled: set[str]

        @property
        def reqs(self) -> dict[int, Request]: ...
        def log(self, *parts: object) -> None: ...

    def _some(self, most: int) -> list[int]:
        return self.rng.sample(list(self.reqs), min(len(self.reqs), self.rng.randint(1, most)))

    def _length(self) -> int:
        return self.rng.randint(1, self.max_new_tokens)

    def op_new(self):
        if self.extend([], [], [self._length() for _ in range(self.rng.randint(1, 3))]) is None:
            self.shortfall()

    def op_extend(self):
        if not self.reqs:
            return False
        old = self._some(3)
        new = [self._length()] if self.rng.random() < 0.3 else []
        if self.extend(old, [self._length() for _ in old], new) is None:
            self.shortfall()

    def op_new_alloc(self):
        if self.admit_alloc(self.ps * self.rng.randint(1, max(1, self.max_new_tokens // self.ps))) is None:
            self.shortfall()

    def op_decode(self):
        if not self.reqs:
            return False
        if self.decode(self._some(self.max_batch)) is None:
            self.shortfall()

    def op_ratchet(self):
        if self.window_band is None:
            self.disabled.add("ratchet")
            return False
        done = False
        for rid in list(self.reqs):
            if self.rng.random() < 0.7:
                start_pos = self.rng.random() < 0.8
                offset = self.rng.randrange(self.ps) if self.rng.random() < 0.3 else 0
                done |= self.ratchet(rid, start_pos=start_pos, offset=offset)
        return done

    def op_free(self):
        if not self.reqs:
            return False
        self.free_request(self.rng.choice(list(self.reqs)))

    def op_state(self):
        if not self.state_bands:
            self.disabled.add("state")
            return False
        band = self.rng.choice(self.state_bands)
        if self.orphans[band] and self.rng.random() < 0.5:
            self.rng.shuffle(self.orphans[band])
            self.free_orphans(band, self.rng.randint(1, len(self.orphans[band])))
        elif self.alloc_orphans(band, self.rng.randint(1, 3)) is None:
            self.shortfall()

    def op_flush(self):
        urgent = self.rng.random() < 0.3
        self.log("flush", "urgent" if urgent else "", "->", self.pool.flush(urgent=urgent))

    def op_make_room(self):
        side = self.rng.choice(["low", "high"])
        want = self.rng.randint(1, self.pool.layout.total_bytes // 3)
        return self._float_op(lambda: self.pool.make_room(side, want), "make_room", side, want)

    def op_compact(self):
        side = self.rng.choice(["low", "high"])
        return self._float_op(lambda: self.pool.compact_holes(side), "compact_holes", side)

    def _float_op(self, call: Callable[[], int], *what):
        try:
            got = call()
        except ValueError as exc:
            if "no float band" not in str(exc):
                raise
            self.disabled |= {"make_room", "compact"}
            return False
        self.log(*what, "->", got)

    def op_launch(self):
        """A forward over the last batch, or over a few requests rewriting
        their last token (so its written pages need not sit at a frontier)."""
        if self.last_batch is not None and self.rng.random() < 0.5:
            return self.launch() is not None
        if not self.reqs:
            return False
        rids = self._some(3)
        return self.launch(rids, [self.reqs[r].tokens[-1] for r in rids]) is not None

    def op_clear(self):
        self.clear()

    def op_avail(self):
        if self.state_bands and self.rng.random() < 0.3:
            return self.probe_state(self.rng.choice(self.state_bands), self.rng.random() < 0.3) is not None
        return self.probe_available(keep=self.rng.random() < 0.3) is not None
