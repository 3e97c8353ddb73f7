"""A random-operation driver and an invariant checker for unified pools.

`Driver(pool, rng)` plays the serving engine against a pool: it admits,
extends, decodes, ratchets a sliding window, frees, allocates state slots,
flushes, slides the float, launches and finishes forwards, and clears. It
keeps a plain-Python model of what the engine holds (live requests, their
virtual token ids, released window pages, state slots) and, on materialised
backends, a shadow copy of the bytes every live slot must hold: each
allocation writes a distinct pattern into the new slots through
`pool.translate` + `pool.buffer_view`, and each forward writes a fresh
pattern when its event fires, at the physical slots its ids translated to at
launch (as a real kernel would). `Driver.check()` then compares the pool with
the model and returns violation strings (empty = healthy).

The forward model (one forward in flight at a time, as the pool tracks one):
the forward reads every live slot of its batch's requests and writes the
slots the batch's last allocation produced. The engine never frees or
releases a page the running forward touches; the driver fires the forward
first instead. So a move of a written page before the event fires shows up
as stale bytes at the page's new home, and the reuse of a vacated page while
the forward reads it shows up as changed bytes under the forward's reads.
"""

from __future__ import annotations

import collections
import random

import torch

from unikv.testing.checks import Checks
from unikv.testing.model import Forward, Request
from unikv.testing.patterns import _same, pattern_rows
from unikv.testing.random_ops import DEFAULT_WEIGHTS, RandomOps


class Driver(RandomOps, Checks):
    """Random operations against `pool`, with a model to check it against.

    Engine actions (`extend`, `admit_alloc`, `decode`, `ratchet`,
    `free_request`, `alloc_orphans`, `free_orphans`, `launch`, `fire`,
    `clear`, `probe_available`, `probe_state`) take explicit arguments and
    keep the model in step, so a property-based state machine can call them
    as rules; `step()` picks one random `op_*` by `weights` and draws its
    arguments from `rng`. An alloc that falls short returns None from the
    action; the random ops then evict a random request (`shortfall`).

    Args:
        pool: a `UnifiedPool` or a baseline answering the same surface.
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

    def __init__(self, pool, rng: random.Random, *, window_tokens: int | None = None,
                 window_band: str | None = None, max_batch: int = 8,
                 max_new_tokens: int | None = None, weights: dict | None = None,
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
        self.bytes = bool(getattr(pool.backend, "materialized", False))
        self.entry = {b.name: b.entry_bytes for b in layout.bands}
        sizes = {n: pool.vids.size * self.ps for n in self.token_bands}
        sizes.update({n: pool.state_ids[n].size for n in self.state_bands})
        self.live = {n: torch.zeros(s, dtype=torch.bool) for n, s in sizes.items()}
        self.shadow = ({n: torch.zeros(s, self.entry[n], dtype=torch.uint8) for n, s in sizes.items()}
                       if self.bytes else {})
        self.views = {n: pool.buffer_view(n) for n in sizes} if self.bytes else {}
        self.reqs: dict[int, Request] = {}
        self.orphans: dict[str, list[int]] = {n: [] for n in self.state_bands}
        self.next_rid = 1
        self.stamp = 1
        self.ops = 0
        # The last decode / extend: (request id of each new token, token ids).
        self.last_batch: tuple[list[int], list[int]] | None = None
        self.inflight: Forward | None = None
        self.pending_violations: list[str] = []
        self.counts: collections.Counter = collections.Counter()
        self.history: collections.deque = collections.deque(maxlen=40)
        self.disabled: set[str] = set()

    # -- running --

    def step(self) -> str:
        """Run one random op (firing a due forward first); returns its name."""
        self.ops += 1
        if self.inflight is not None and self.ops >= self.inflight.fire_at:
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

    def log(self, *parts) -> None:
        self.history.append(" ".join(str(p) for p in parts))

    # -- model helpers --

    @staticmethod
    def _tensor(ids) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            return ids.to(torch.int64).reshape(-1)
        return torch.tensor(list(ids), dtype=torch.int64)

    def _new_rows(self, band: str, n: int) -> torch.Tensor:
        rows = pattern_rows(torch.arange(self.stamp, self.stamp + n), self.entry[band])
        self.stamp += n
        return rows

    def _write(self, band: str, ids: torch.Tensor) -> None:
        """Mark `ids` live on `band` and write their fresh pattern."""
        self.live[band][ids] = True
        if not self.bytes or ids.numel() == 0:
            return
        rows = self._new_rows(band, int(ids.numel()))
        self.views[band].index_copy_(0, self.pool.translate(ids, band), rows)
        self.shadow[band].index_copy_(0, ids, rows)

    def _write_tokens(self, ids: torch.Tensor) -> None:
        for band in self.token_bands:
            self._write(band, ids)

    def _pairs(self, band: str, tokens) -> set:
        """(band, virtual page) of token ids."""
        return {(band, t // self.ps) for t in tokens}

    def _settle_if_touched(self, pairs: set) -> None:
        """The engine never frees what the running forward touches: it
        waits for the forward first."""
        if self.inflight is not None and not self.inflight.touched.isdisjoint(pairs):
            self.fire()

    def _new_request(self, tokens: list[int], states: dict[str, int]) -> int:
        rid = self.next_rid
        self.next_rid += 1
        self.reqs[rid] = Request(rid, tokens, states)
        return rid

    # -- engine actions (deterministic; None means the pool fell short) --

    def extend(self, rids: list[int], adds: list[int], new_lengths: list[int] = ()) -> list[int] | None:
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
        ids, pos, batch = out.tolist(), 0, []
        for i, a in enumerate(adds):
            chunk = ids[pos:pos + a]
            pos += a
            if i < len(reqs):
                reqs[i].tokens += chunk
                batch.append(reqs[i].rid)
            else:
                batch.append(self._new_request(chunk, states[i - len(reqs)]))
        self._write_tokens(out)
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
        rid = self._new_request(out.tolist(), states[0])
        self._write_tokens(out)
        self.log("alloc", rid, n)
        return rid

    def decode(self, rids: list[int]) -> bool | None:
        """One `alloc_decode` token for each request of `rids`."""
        reqs = [self.reqs[r] for r in rids]
        out = self.pool.alloc_decode([len(r.tokens) + 1 for r in reqs], [r.tokens[-1] for r in reqs])
        if out is None:
            self.log("short: alloc_decode", rids)
            return None
        ids = out.tolist()
        for r, t in zip(reqs, ids):
            r.tokens.append(t)
        self._write_tokens(out)
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
            self.pool.release(self._tensor(run), band=band, start_pos=r.released + min(offset, self.ps - 1))
        else:
            self.pool.release(self._tensor(self.rng.sample(run, len(run))), band=band)
        self.live[band][self._tensor(ids)] = False
        self.log("release", rid, r.released, cut, f"offset {offset}", "start_pos" if start_pos else "")
        r.released = cut
        return True

    def free_request(self, rid: int) -> None:
        """Finish `rid`: `free` its tokens, `free_state` its slots."""
        r = self.reqs[rid]
        pairs = {(b, s) for b, s in r.states.items()}
        for band in self.token_bands:
            pairs |= self._pairs(band, r.tokens)
        self._settle_if_touched(pairs)
        del self.reqs[rid]
        ids = self._tensor(r.tokens)
        self.pool.free(ids)
        for band in self.token_bands:
            self.live[band][ids] = False
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
            got[band] = ids.tolist()
            self._write(band, ids)
        return [{b: got[b][i] for b in got} for i in range(count)]

    def free_states(self, states: list[dict[str, int]]) -> None:
        for st in states:
            self._settle_if_touched(set(st.items()))
            for band, s in st.items():
                self.pool.free_state(band, [s])
                self.live[band][s] = False

    def alloc_orphans(self, band: str, k: int) -> list[int] | None:
        """`k` state slots no request owns (e.g. cached prefix snapshots)."""
        ids = self.pool.alloc_state(band, k)
        if ids is None:
            self.log("short: alloc_state", band, k)
            return None
        self.orphans[band] += ids.tolist()
        self._write(band, ids)
        self.log("alloc_state", band, ids.tolist())
        return ids.tolist()

    def free_orphans(self, band: str, k: int) -> None:
        """Free the first `k` unowned slots of `band` in one call."""
        self.free_orphans_ids(band, self.orphans[band][:k])

    def free_orphans_ids(self, band: str, ids: list[int]) -> None:
        self._settle_if_touched({(band, s) for s in ids})
        gone = set(ids)
        self.orphans[band] = [s for s in self.orphans[band] if s not in gone]
        if ids:
            self.pool.free_state(band, ids)
            self.live[band][self._tensor(ids)] = False
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
        for mask in self.live.values():
            mask.zero_()
        self.reqs.clear()
        self.orphans = {n: [] for n in self.state_bands}
        self.last_batch = None
        self.log("clear")

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
        rid = self._new_request(out.tolist(), {})
        self._write_tokens(out)
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
        self.orphans[band] += ids.tolist()
        self._write(band, ids)
        self.log("probe alloc_state", band, n)
        if not keep:
            self.free_orphans_ids(band, ids.tolist())
        return ids.tolist()

    # -- forwards --

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
        written = self._tensor(write_ids or [])
        if not reqs or written.numel() == 0:
            return None
        fwd = Forward(self.pool.backend.new_event(f"forward@{self.ops}"),
                      self.ops + self.rng.randint(1, self.forward_delay), set(), [], [])
        for band in self.token_bands:
            toks = self._tensor([t for r in reqs for t in r.tokens])
            toks = toks[self.live[band][toks]]
            fwd.touched |= self._pairs(band, toks.tolist())
            self._plan_io(fwd, band, toks, written[self.live[band][written]])
        states: dict[str, list[int]] = {}
        for band in self.state_bands:
            states[band] = [r.states[band] for r in reqs if band in r.states]
            fwd.touched |= {(band, s) for s in states[band]}
            self._plan_io(fwd, band, self._tensor(states[band]), self._tensor(states[band]))
        fwd.event.on_fire(lambda: self._forward_done(fwd))
        self.inflight = fwd
        self.pool.set_inflight_forward(fwd.event, write_ids=written,
                                       state_write_ids={b: s for b, s in states.items() if s})
        self.log("launch", rids, "writes", len(write_ids), "fires at", fwd.fire_at)
        return fwd

    def _plan_io(self, fwd: Forward, band: str, reads: torch.Tensor, writes: torch.Tensor) -> None:
        if not self.bytes:
            return
        if reads.numel():
            fwd.reads.append((band, reads, self.pool.translate(reads, band),
                              self.shadow[band].index_select(0, reads)))
        if writes.numel():
            fwd.writes.append((band, writes, self.pool.translate(writes, band),
                               self._new_rows(band, int(writes.numel()))))

    def fire(self) -> None:
        """Finish the in-flight forward (its writes land now)."""
        if self.inflight is not None:
            self.inflight.event.fire()

    def _forward_done(self, fwd: Forward) -> None:
        """The event fired (from the driver or a settle inside the pool):
        check the forward's reads were undisturbed, then land its writes at
        the slots its ids had at launch."""
        self.counts["fired"] += 1
        if self.inflight is fwd:
            self.inflight = None
        for band, ids, phys, rows in fwd.reads:
            got = self.views[band].index_select(0, phys)
            if _same(got, rows):
                continue
            bad = (got != rows).any(1)
            if bool(bad.any()):
                self.pending_violations.append(
                    f"[{band}] read hazard: slots {phys[bad][:8].tolist()} (virtual "
                    f"{ids[bad][:8].tolist()}) changed while the forward read them")
        for band, ids, phys, rows in fwd.writes:
            self.views[band].index_copy_(0, phys, rows)
            self.shadow[band].index_copy_(0, ids, rows)

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
