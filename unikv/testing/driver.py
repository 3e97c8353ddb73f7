"""The random driver: seeded random engine operations against a pool.

`Driver(pool, rng)` plays the serving engine against a pool: it admits,
extends, decodes, ratchets a sliding window, frees, allocates state slots,
flushes, slides the float, launches and finishes forwards, and clears. It
steps the same reference model (`model.ChainModel`), byte shadow
(`shadow.ShadowBytes`) and forward model (`forward`) as the conformance
machine, and `Driver.check()` runs the same invariant
(`checks.pool_violations`), plus the violations its forwards and probes saw.

The forward model (one forward in flight at a time, as the pool tracks one):
the forward reads every live slot of its batch's requests and writes the
slots the batch's last allocation produced. The engine never frees or
releases a page the running forward touches; the driver fires the forward
first instead. The benchmarks' soak and the per-module tests use it where a
hypothesis machine would be too slow or too unwieldy: long seeded runs.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from unikv.testing.checks import pool_violations
from unikv.testing.device import host_ids
from unikv.testing.driver_engine import ForwardsAndProbes
from unikv.testing.forward import Forward
from unikv.testing.model import ChainModel, Request
from unikv.testing.random_ops import DEFAULT_WEIGHTS, RandomOps
from unikv.testing.shadow import ShadowBytes, write_fresh

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool


class Driver(ForwardsAndProbes, RandomOps):
    """Random operations against `pool`, with a model to check it against.

    Engine actions (`extend`, `admit_alloc`, `decode`, `ratchet`,
    `free_request`, `alloc_orphans`, `free_orphans`, `launch`, `fire`,
    `clear`, `probe_available`, `probe_state`) take explicit arguments and
    keep the model in step; `step()` picks one random `op_*` by `weights`
    and draws its arguments from `rng`. An alloc that falls short returns
    None from the action; the random ops then evict a random request
    (`shortfall`).

    Args:
        pool: a `UnifiedPool` or a baseline answering the same surface, on
            any backend.
        rng: a `random.Random` (all choices come from it).
        window_tokens: sliding window W of the window band (default
            `2 * page_size + 5`).
        window_band: token band the ratchet releases on (default "swa" when
            the layout has it and it is not the only token band, else none).
        max_batch: most requests of one decode batch.
        max_new_tokens: most tokens one request gains in one extend.
        weights: op name -> weight, overriding `DEFAULT_WEIGHTS`.
        check_overlap: check that live pages share no byte (off for the
            oracle, whose physical ids are bookkeeping only).
        forward_delay: most ops a launched forward runs before it fires.
    """

    def __init__(self, pool: UnifiedPool, rng: random.Random, *, window_tokens: int | None = None,
                 window_band: str | None = None, max_batch: int = 8,
                 max_new_tokens: int | None = None, weights: dict[str, float] | None = None,
                 check_overlap: bool = True, forward_delay: int = 4) -> None:
        self.pool = pool
        self.rng = rng
        layout = pool.layout
        self.ps = pool.page_size
        self.token_bands = [b.name for b in layout.token_bands]
        self.state_bands = [b.name for b in layout.state_bands]
        if window_band is None and "swa" in self.token_bands and len(self.token_bands) > 1:
            window_band = "swa"
        self.window_band = window_band
        self.window = window_tokens if window_tokens is not None else 2 * self.ps + 5
        self.max_batch = max_batch
        self.max_new_tokens = max_new_tokens or max(16, 4 * self.ps + 7)
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        self.check_overlap = check_overlap
        self.forward_delay = forward_delay
        sizes = {n: pool.vids.size * self.ps for n in self.token_bands}
        sizes.update({n: pool.state_ids[n].size for n in self.state_bands})
        self.model = ChainModel(self.token_bands, self.state_bands, self.ps)
        self.shadow = ShadowBytes(pool, sizes)
        self.orphans: dict[str, list[int]] = {n: [] for n in self.state_bands}
        self.ops = 0
        # The last decode / extend: (request id of each new token, token ids).
        self.last_batch: tuple[list[int], list[int]] | None = None
        self.inflight: Forward | None = None
        self.pending_violations: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.history: collections.deque = collections.deque(maxlen=40)
        self.disabled: set[str] = set()

    @property
    def reqs(self) -> dict[int, Request]:
        """The live requests, in admission order (the model's)."""
        return self.model.reqs

    # -- running --

    def step(self) -> str:
        """Run one random op (firing a due forward first); returns its name."""
        self.ops += 1
        fire_at = self.inflight.fire_at if self.inflight is not None else None
        if fire_at is not None and self.ops >= fire_at:
            self.fire()
        names = [n for n in self.weights if n not in self.disabled and self.weights[n] > 0]
        name = self.rng.choices(names, [self.weights[n] for n in names])[0]
        done = getattr(self, f"op_{name}")()
        self.counts[name if done is not False else f"{name}:skipped"] += 1
        return name

    def run(self, n: int, check_every: int = 1) -> list[str]:
        """`n` steps, checking every `check_every`; stops at the first
        violation and returns it with the recent op history."""
        for i in range(n):
            self.step()
            if (i + 1) % check_every == 0:
                out = self.check()
                if out:
                    return out + [f"after op {self.ops}; recent ops: {list(self.history)}"]
        return []

    def check(self) -> list[str]:
        """Violations of the pool against the model (empty = healthy): what
        forwards and probes saw since the last check, then the invariant."""
        out, self.pending_violations = self.pending_violations, []
        return out + pool_violations(self.pool, self.model, self.shadow, overlap=self.check_overlap)

    def log(self, *parts: object) -> None:
        self.history.append(" ".join(str(p) for p in parts))

    # -- model helpers --

    def _write(self, band: str, ids: list[int]) -> None:
        """Write fresh patterns into `ids` of `band` (the model marks them live)."""
        write_fresh(self.pool, self.shadow, self.model, band, ids)

    def _new_tokens(self, rid: int, ids: list[int]) -> None:
        """`rid` got token ids `ids`: bind their fresh pages, write them."""
        self.model.bind(self.model.fresh_pages(ids), rid)
        self.model.reqs[rid].tokens += ids
        pages = self.model.pages
        for band in self.token_bands:
            self._write(band, [t for t in ids if band in pages[t // self.ps].bands])

    def _pairs(self, band: str, tokens) -> set:
        """(band, virtual page) of token ids."""
        return {(band, t // self.ps) for t in tokens}

    def _settle_if_touched(self, pairs: set) -> None:
        """The engine never frees what the running forward touches: it
        waits for the forward first."""
        if self.inflight is not None and self.inflight.touches(pairs):
            self.fire()

    # -- engine actions (deterministic; None means the pool fell short) --

    def extend(self, rids: list[int], adds: list[int], new_lengths: Sequence[int] = ()) -> list[int] | None:
        """One `alloc_extend`: request `rids[i]` gains `adds[i]` tokens (tail
        page reused) and a new request (prefix 0, one state slot per state
        band) is admitted per `new_lengths`. Returns the batch's request ids."""
        states = self.alloc_states(len(new_lengths))
        if states is None:
            return None
        reqs = [self.reqs[r] for r in rids]
        prefix = [len(r.tokens) for r in reqs] + [0] * len(new_lengths)
        adds = list(adds) + list(new_lengths)
        seq = [p + a for p, a in zip(prefix, adds)]
        last = [r.tokens[-1] for r in reqs] + [0] * len(new_lengths)
        out = self.pool.alloc_extend(prefix, seq, last, sum(adds))
        if out is None:
            self.free_states(states)
            self.log("short: alloc_extend", prefix, seq)
            return None
        ids, pos, batch = host_ids(out).tolist(), 0, []
        for i, a in enumerate(adds):
            chunk = ids[pos:pos + a]
            pos += a
            rid = reqs[i].rid if i < len(reqs) else self.model.new_request(states=states[i - len(reqs)])
            self._new_tokens(rid, chunk)
            batch.append(rid)
        self.last_batch = ([rid for rid, a in zip(batch, adds) for _ in range(a)], ids)
        self.log("extend", list(zip(batch, prefix, seq)))
        return batch

    def admit_alloc(self, n: int) -> int | None:
        """A new request of `n` tokens (a multiple of page_size) by plain `alloc`."""
        states = self.alloc_states(1)
        if states is None:
            return None
        out = self.pool.alloc(n)
        if out is None:
            self.free_states(states)
            self.log("short: alloc", n)
            return None
        rid = self.model.new_request(states=states[0])
        self._new_tokens(rid, host_ids(out).tolist())
        self.log("alloc", rid, n)
        return rid

    def decode(self, rids: list[int]) -> bool | None:
        """One `alloc_decode` token for each request of `rids`."""
        reqs = [self.reqs[r] for r in rids]
        out = self.pool.alloc_decode([len(r.tokens) + 1 for r in reqs], [r.tokens[-1] for r in reqs])
        if out is None:
            self.log("short: alloc_decode", rids)
            return None
        ids = host_ids(out).tolist()
        for rid, t in zip(rids, ids):
            self._new_tokens(rid, [t])
        self.last_batch = (list(rids), ids)
        self.log("decode", rids)
        return True

    def ratchet(self, rid: int, start_pos: bool = True, offset: int = 0) -> bool:
        """Release on the window band the whole pages of `rid` that left the
        window. The ids passed start `offset` tokens into the first such page
        (any id of a page releases all of it); `start_pos` passes the run's
        position, else the ids go in shuffled. False: nothing to release."""
        r, band = self.reqs[rid], self.window_band
        cut = (len(r.tokens) - self.window) // self.ps * self.ps
        if band is None or cut <= r.released:
            return False
        ids = r.tokens[r.released:cut]
        self._settle_if_touched(self._pairs(band, ids))
        run = ids[min(offset, self.ps - 1):]
        if start_pos:
            self.pool.release(host_ids(run), band=band, start_pos=r.released + min(offset, self.ps - 1))
        else:
            self.pool.release(host_ids(self.rng.sample(run, len(run))), band=band)
        self.model.release(band, sorted({t // self.ps for t in ids}))
        self.log("release", rid, r.released, cut, f"offset {offset}", "start_pos" if start_pos else "")
        r.released = cut
        return True

    def free_request(self, rid: int) -> None:
        """Finish `rid`: `free` its tokens, `free_state` its slots."""
        r = self.reqs[rid]
        pairs = set(r.states.items())
        for band in self.token_bands:
            pairs |= self._pairs(band, r.tokens)
        self._settle_if_touched(pairs)
        self.model.drop_request(rid)
        self.pool.free(host_ids(r.tokens))
        self.free_states([r.states])
        self.log("free", rid, len(r.tokens))

    def alloc_states(self, count: int) -> list[dict[str, int]] | None:
        """One slot on every state band for each of `count` requests."""
        if count == 0 or not self.state_bands:
            return [{} for _ in range(count)]
        got: dict[str, list[int]] = {}
        for band in self.state_bands:
            ids = self.pool.alloc_state(band, count)
            if ids is None:
                self.free_states([{b: s[i] for b, s in got.items()} for i in range(count)])
                self.log("short: alloc_state", band, count)
                return None
            got[band] = host_ids(ids).tolist()
            self._write(band, got[band])
        return [{b: got[b][i] for b in got} for i in range(count)]

    def free_states(self, states: list[dict[str, int]]) -> None:
        for st in states:
            self._settle_if_touched(set(st.items()))
            for band, s in st.items():
                self.pool.free_state(band, [s])
                self.model.free_states(band, [s])

    def alloc_orphans(self, band: str, k: int) -> list[int] | None:
        """`k` state slots no request owns (e.g. cached prefix snapshots)."""
        ids = self.pool.alloc_state(band, k)
        if ids is None:
            self.log("short: alloc_state", band, k)
            return None
        got = host_ids(ids).tolist()
        self.orphans[band] += got
        self._write(band, got)
        self.log("alloc_state", band, got)
        return got

    def free_orphans(self, band: str, k: int) -> None:
        """Free the first `k` unowned slots of `band` in one call."""
        self.free_orphans_ids(band, self.orphans[band][:k])

    def free_orphans_ids(self, band: str, ids: list[int]) -> None:
        self._settle_if_touched({(band, s) for s in ids})
        gone = set(ids)
        self.orphans[band] = [s for s in self.orphans[band] if s not in gone]
        if ids:
            self.pool.free_state(band, ids)
            self.model.free_states(band, ids)
        self.log("free_state", band, ids)

    def free_all(self) -> None:
        """Finish the forward and every request, free every state slot."""
        self.fire()
        for rid in list(self.reqs):
            self.free_request(rid)
        for band in self.state_bands:
            self.free_orphans(band, len(self.orphans[band]))

    def clear(self) -> None:
        """`pool.clear()` (after the forward finished) and forget everything."""
        self.fire()
        self.pool.clear()
        self.model.clear()
        self.orphans = {n: [] for n in self.state_bands}
        self.last_batch = None
        self.log("clear")

    # -- random ops (each returns False when it had nothing to do) --

    def shortfall(self) -> None:
        """An alloc fell short: the engine evicts a random request."""
        self.counts["shortfall"] += 1
        if self.reqs:
            self.free_request(self.rng.choice(list(self.reqs)))
        elif any(self.orphans.values()):
            band = self.rng.choice([b for b in self.state_bands if self.orphans[b]])
            self.free_orphans(band, len(self.orphans[band]))

    def summary(self) -> dict:
        """Op counts and the pool's counters, for reports."""
        st = self.pool.stats()
        return {"ops": self.ops, "counts": dict(self.counts), "shortfalls": self.counts["shortfall"],
                "moves": st["moves"], "flushes": st["flushes"], "relocations": st["relocations"],
                "settles": st["settles"], "ladder_runs": st["ladder_runs"], "live_requests": len(self.reqs)}
