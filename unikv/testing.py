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
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from unikv.layout import Band, Layout, Unit

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
    "launch": 8.0,  # declare a forward over the last decode / extend batch
    "clear": 0.05,
    "avail": 2.0,  # alloc exactly available_size(): must fit with no move
}


_NOISE = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def pattern_rows(stamps: torch.Tensor, entry_bytes: int) -> torch.Tensor:
    """`[n, entry_bytes]` uint8 rows, distinct per stamp: the stamp's
    little-endian bytes, then a noise window the stamp selects."""
    stamps = stamps.to(torch.int64)
    span = _NOISE.numel() - entry_bytes
    if span <= 0:
        raise ValueError(f"entry_bytes={entry_bytes} exceeds the {_NOISE.numel()}-byte pattern source")
    rows = _NOISE.unfold(0, entry_bytes, 1)[(stamps * 7919) % span]
    k = min(8, entry_bytes)
    rows[:, :k] = stamps.reshape(-1, 1).view(torch.uint8)[:, :k]
    return rows


CHAINS = ("full", "full|swa", "swa|full", "mamba|full", "mamba|swa|full")
ENTRY_BYTES = {"full": 700, "swa": 300, "mamba": 5000}  # no one a multiple of another


def make_layout(chain: str, page_size: int, tokens: int, states: int = 8,
                entry_bytes: Optional[dict] = None) -> Layout:
    """A small layout for soak and property tests.

    Args:
        chain: band names low -> high joined by "|", from `CHAINS` (the
            first band grows up, the last down, a middle one floats; "mamba"
            is a request band, the others token bands).
        page_size: token bands' page size.
        tokens: tokens of every token band the buffer holds past the sink.
        states: state slots of every state band it holds on top.
        entry_bytes: band name -> bytes per slot (default `ENTRY_BYTES`).
    """
    sizes = {**ENTRY_BYTES, **(entry_bytes or {})}
    names = chain.split("|")
    bands = []
    for i, name in enumerate(names):
        grow = "down" if i == len(names) - 1 else "up" if i == 0 else "float"
        if name == "mamba":
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, unit="request"))
        else:
            bands.append(Band(name, entry_bytes=sizes[name], grow=grow, page_size=page_size))
    per_token = sum(b.entry_bytes for b in bands if b.unit is Unit.TOKEN)
    per_state = sum(b.entry_bytes for b in bands if b.unit is Unit.REQUEST)
    sink = max([b.entry_bytes for b in bands] + [b.page_bytes for b in bands if b.unit is Unit.TOKEN])
    return Layout(total_bytes=sink + tokens * per_token + states * per_state, bands=bands)


@dataclass
class Request:
    """The engine's view of one request.

    `tokens[i]` is the virtual id of position i; positions `[0, released)`
    (a multiple of page_size) are released on the window band; `states`
    maps a state band to the request's slot id there.
    """

    rid: int
    tokens: list[int]
    states: dict[str, int] = field(default_factory=dict)
    released: int = 0


@dataclass
class Forward:
    """A launched forward: its event, what it touches, reads and writes."""

    event: object
    fire_at: int  # driver op count at which the driver fires it
    touched: set  # (band, virtual page or state id) it reads or writes
    reads: list  # (band, launch-time physical slots, rows expected there)
    writes: list  # (band, virtual ids, launch-time physical slots, new rows)


class Driver:
    """Random operations against `pool`, with a model to check it against.

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

    def __init__(self, pool, rng: random.Random, *, window_tokens: Optional[int] = None,
                 window_band: Optional[str] = None, max_batch: int = 8,
                 max_new_tokens: Optional[int] = None, weights: Optional[dict] = None,
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
        self.last_batch: Optional[tuple[list[int], list[int]]] = None
        self.inflight: Optional[Forward] = None
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

    def _tensor(self, ids) -> torch.Tensor:
        return torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids,
                               dtype=torch.int64).reshape(-1)

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
        self.views[band][self.pool.translate(ids, band)] = rows
        self.shadow[band][ids] = rows

    def _write_tokens(self, ids: torch.Tensor) -> None:
        for band in self.token_bands:
            self._write(band, ids)

    def _touches(self, pairs) -> bool:
        return self.inflight is not None and not self.inflight.touched.isdisjoint(pairs)

    def _token_pairs(self, band: str, tokens) -> set:
        return {(band, t // self.ps) for t in tokens}

    def shortfall(self, what: str) -> None:
        """An alloc returned None: the engine evicts a random request."""
        self.counts["shortfall"] += 1
        self.log("shortfall", what)
        if self.reqs:
            self.free_request(self.rng.choice(list(self.reqs)))
        elif any(self.orphans.values()):
            band = self.rng.choice([b for b in self.state_bands if self.orphans[b]])
            self._free_orphans(band, len(self.orphans[band]))

    def free_request(self, rid: int) -> None:
        r = self.reqs[rid]
        pairs = set()
        for band in self.token_bands:
            pairs |= self._token_pairs(band, r.tokens)
        pairs |= {(b, s) for b, s in r.states.items()}
        if self._touches(pairs):
            self.fire()
        del self.reqs[rid]
        ids = self._tensor(r.tokens)
        self.pool.free(ids)
        for band in self.token_bands:
            self.live[band][ids] = False
        for band, s in r.states.items():
            self.pool.free_state(band, [s])
            self.live[band][s] = False
        self.log("free", rid, len(r.tokens))

    def _alloc_states(self, count: int) -> Optional[list[dict[str, int]]]:
        """One slot per state band for each of `count` new requests."""
        got: dict[str, list[int]] = {}
        for band in self.state_bands:
            ids = self.pool.alloc_state(band, count)
            if ids is None:
                self._free_states([{b: s[i] for b, s in got.items()} for i in range(count)])
                self.shortfall(f"alloc_state {band} {count}")
                return None
            got[band] = ids.tolist()
            self._write(band, ids)
        return [{b: got[b][i] for b in got} for i in range(count)]

    def _free_states(self, states: list[dict[str, int]]) -> None:
        for st in states:
            for band, s in st.items():
                self.pool.free_state(band, [s])
                self.live[band][s] = False

    def _free_orphans(self, band: str, k: int) -> None:
        ids = self.orphans[band][:k]
        if self._touches({(band, s) for s in ids}):
            self.fire()
        self.orphans[band] = self.orphans[band][k:]
        self.pool.free_state(band, ids)
        self.live[band][self._tensor(ids)] = False
        self.log("free_state", band, ids)

    # -- ops (each returns False when it had nothing to do) --

    def op_new(self):
        return self._extend_batch(self.rng.randint(1, 3), [])

    def op_extend(self):
        if not self.reqs:
            return False
        old = self.rng.sample(list(self.reqs), min(len(self.reqs), self.rng.randint(1, 3)))
        return self._extend_batch(int(self.rng.random() < 0.3), old)

    def _extend_batch(self, new_count: int, old: list[int]):
        """One alloc_extend over `old` requests (tail-page reuse) and
        `new_count` new ones (prefix 0)."""
        states = self._alloc_states(new_count) if self.state_bands else [{}] * new_count
        if states is None:
            return True
        reqs = [self.reqs[r] for r in old]
        prefix = [len(r.tokens) for r in reqs] + [0] * new_count
        add = [self.rng.randint(1, self.max_new_tokens) for _ in prefix]
        seq = [p + a for p, a in zip(prefix, add)]
        last = [r.tokens[-1] for r in reqs] + [0] * new_count
        out = self.pool.alloc_extend(prefix, seq, last, sum(add))
        if out is None:
            self._free_states(states)
            self.shortfall(f"alloc_extend {prefix}->{seq}")
            return True
        chunks = out.tolist()
        rids, pos = [], 0
        for i, a in enumerate(add):
            chunk = chunks[pos:pos + a]
            pos += a
            if i < len(reqs):
                reqs[i].tokens += chunk
                rids.append(reqs[i].rid)
            else:
                rid = self.next_rid
                self.next_rid += 1
                self.reqs[rid] = Request(rid, chunk, states[i - len(reqs)])
                rids.append(rid)
        self._write_tokens(out)
        self.last_batch = ([rid for rid, a in zip(rids, add) for _ in range(a)], chunks)
        self.log("extend", list(zip(rids, prefix, seq)))
        return True

    def op_new_alloc(self):
        n = self.ps * self.rng.randint(1, max(1, self.max_new_tokens // self.ps))
        states = self._alloc_states(1) if self.state_bands else [{}]
        if states is None:
            return True
        out = self.pool.alloc(n)
        if out is None:
            self._free_states(states)
            self.shortfall(f"alloc {n}")
            return True
        rid = self.next_rid
        self.next_rid += 1
        self.reqs[rid] = Request(rid, out.tolist(), states[0])
        self._write_tokens(out)
        self.log("alloc", rid, n)
        return True

    def op_decode(self):
        if not self.reqs:
            return False
        k = min(len(self.reqs), self.rng.randint(1, self.max_batch))
        reqs = [self.reqs[r] for r in self.rng.sample(list(self.reqs), k)]
        seq = [len(r.tokens) + 1 for r in reqs]
        out = self.pool.alloc_decode(seq, [r.tokens[-1] for r in reqs])
        if out is None:
            self.shortfall(f"alloc_decode bs={k}")
            return True
        ids = out.tolist()
        for r, t in zip(reqs, ids):
            r.tokens.append(t)
        self._write_tokens(out)
        self.last_batch = ([r.rid for r in reqs], ids)
        self.log("decode", [r.rid for r in reqs])
        return True

    def op_ratchet(self):
        """Release, on the window band, whole pages that left the window."""
        band = self.window_band
        if band is None:
            self.disabled.add("ratchet")
            return False
        did = False
        for r in list(self.reqs.values()):
            cut = (len(r.tokens) - self.window) // self.ps * self.ps
            if cut <= r.released or self.rng.random() < 0.3:
                continue
            ids = r.tokens[r.released:cut]
            if self._touches(self._token_pairs(band, ids)):
                self.fire()
            if self.rng.random() < 0.8:
                self.pool.release(self._tensor(ids), band=band, start_pos=r.released)
            else:
                self.pool.release(self._tensor(ids), band=band)
            self.live[band][self._tensor(ids)] = False
            self.log("release", r.rid, r.released, cut)
            r.released = cut
            did = True
        return did

    def op_free(self):
        if not self.reqs:
            return False
        self.free_request(self.rng.choice(list(self.reqs)))
        return True

    def op_state(self):
        if not self.state_bands:
            self.disabled.add("state")
            return False
        band = self.rng.choice(self.state_bands)
        if self.orphans[band] and self.rng.random() < 0.5:
            self.rng.shuffle(self.orphans[band])
            self._free_orphans(band, self.rng.randint(1, len(self.orphans[band])))
            return True
        k = self.rng.randint(1, 3)
        ids = self.pool.alloc_state(band, k)
        if ids is None:
            self.shortfall(f"alloc_state {band} {k}")
            return True
        self.orphans[band] += ids.tolist()
        self._write(band, ids)
        self.log("alloc_state", band, ids.tolist())
        return True

    def op_flush(self):
        urgent = self.rng.random() < 0.3
        moves = self.pool.flush(urgent=urgent)
        self.log("flush", "urgent" if urgent else "", moves)
        return True

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
        return True

    def op_clear(self):
        self.fire()
        self.pool.clear()
        for mask in self.live.values():
            mask.zero_()
        self.reqs.clear()
        self.orphans = {n: [] for n in self.state_bands}
        self.last_batch = None
        self.log("clear")
        return True

    def op_avail(self):
        """alloc(available_size()) must fit without moving a page."""
        n = self.pool.available_size()
        if n % self.ps:
            self.pending_violations.append(f"available_size() {n} is not a multiple of {self.ps}")
            return True
        if n == 0 or not self.token_bands:
            return False
        moves = self.pool.stats()["moves"]
        out = self.pool.alloc(n)
        if out is None:
            self.pending_violations.append(f"alloc(available_size()={n}) returned None")
            return True
        if self.pool.stats()["moves"] != moves:
            self.pending_violations.append(f"alloc(available_size()={n}) moved pages")
        rid = self.next_rid
        self.next_rid += 1
        self.reqs[rid] = Request(rid, out.tolist())
        self._write_tokens(out)
        self.log("avail alloc", rid, n)
        if self.rng.random() < 0.7:
            self.free_request(rid)
        return True

    # -- forwards --

    def op_launch(self):
        """Declare a forward over the last decode / extend batch."""
        if self.last_batch is None:
            return False
        self.fire()
        rids, ids = self.last_batch
        self.last_batch = None
        reqs = [self.reqs[r] for r in dict.fromkeys(rids) if r in self.reqs]
        # Only ids of requests still live: a freed request's ids may be reused.
        written = self._tensor([t for r, t in zip(rids, ids) if r in self.reqs])
        any_live = torch.zeros(written.numel(), dtype=torch.bool)
        for band in self.token_bands:
            any_live |= self.live[band][written]
        written = written[any_live]
        if not reqs or written.numel() == 0:
            return False
        fwd = Forward(self.pool.backend.new_event(f"forward@{self.ops}"),
                      self.ops + self.rng.randint(1, self.forward_delay), set(), [], [])
        for band in self.token_bands:
            toks = self._tensor([t for r in reqs for t in r.tokens])
            toks = toks[self.live[band][toks]]
            fwd.touched |= self._token_pairs(band, toks.tolist())
            self._plan_io(fwd, band, toks, written[self.live[band][written]])
        states: dict[str, list[int]] = {}
        for band in self.state_bands:
            sids = self._tensor([r.states[band] for r in reqs if band in r.states])
            states[band] = sids.tolist()
            fwd.touched |= {(band, s) for s in states[band]}
            self._plan_io(fwd, band, sids, sids)
        fwd.event.on_fire(lambda: self._forward_done(fwd))
        self.inflight = fwd
        self.pool.set_inflight_forward(fwd.event, write_ids=written,
                                       state_write_ids={b: s for b, s in states.items() if s})
        self.log("launch", rids, "fires at", fwd.fire_at)
        return True

    def _plan_io(self, fwd: Forward, band: str, reads: torch.Tensor, writes: torch.Tensor) -> None:
        if not self.bytes:
            return
        if reads.numel():
            fwd.reads.append((band, self.pool.translate(reads, band), self.shadow[band][reads].clone(), reads))
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
        for band, phys, rows, ids in fwd.reads:
            bad = (self.views[band][phys] != rows).any(1)
            if bool(bad.any()):
                self.pending_violations.append(
                    f"[{band}] read hazard: slots {phys[bad][:8].tolist()} (virtual "
                    f"{ids[bad][:8].tolist()}) changed while the forward read them")
        for band, ids, phys, rows in fwd.writes:
            self.views[band][phys] = rows
            self.shadow[band][ids] = rows

    # -- checks --

    def check(self, pool=None) -> list[str]:
        """Violations of the pool against the model (empty = healthy)."""
        pool = pool if pool is not None else self.pool
        out, self.pending_violations = self.pending_violations, []
        out += pool.verify()
        out += self._count_violations(pool)
        out += self._tombstone_violations(pool)
        if self.bytes:
            out += self._byte_violations(pool)
        if self.check_overlap:
            out += self._overlap_violations(pool)
        n = pool.available_size()
        if n % self.ps:
            out.append(f"available_size() {n} is not a multiple of page_size {self.ps}")
        if pool.available_size(schedulable=True) < n:
            out.append(f"schedulable available_size {pool.available_size(schedulable=True)} < {n}")
        return out

    def _live_ids(self, band: str) -> torch.Tensor:
        return torch.nonzero(self.live[band]).flatten()

    def _count_violations(self, pool) -> list[str]:
        out = []
        occ = pool.occupancy()["bands"]
        for band in self.token_bands + self.state_bands:
            ids = self._live_ids(band)
            want = int(torch.unique(ids // self.ps).numel()) if band in self.token_bands else int(ids.numel())
            got = occ[band]["live_pages"]
            if got != want:
                out.append(f"[{band}] pool reports {got} live pages, the engine holds {want}")
        return out

    def _tombstone_violations(self, pool) -> list[str]:
        band = self.window_band
        if band is None:
            return []
        others = torch.zeros_like(self.live[band])
        for b in self.token_bands:
            if b != band:
                others |= self.live[b]
        dead = torch.nonzero(others & ~self.live[band]).flatten()
        if dead.numel() and bool((pool.translate(dead, band) != 0).any()):
            return [f"[{band}] released ids do not translate to the sink"]
        return []

    def _byte_violations(self, pool) -> list[str]:
        out = []
        for band in self.token_bands + self.state_bands:
            ids = self._live_ids(band)
            if ids.numel() == 0:
                continue
            phys = pool.translate(ids, band)
            got, want = pool.buffer_view(band)[phys], self.shadow[band][ids]
            if torch.equal(got, want):
                continue
            bad = (got != want).any(1)
            if bool(bad.any()):
                out.append(f"[{band}] {int(bad.sum())} live slots hold wrong bytes: virtual "
                           f"{ids[bad][:8].tolist()} at physical {phys[bad][:8].tolist()}")
        return out

    def _overlap_violations(self, pool) -> list[str]:
        starts, ends, names = [], [], []
        for band in self.token_bands + self.state_bands:
            ids = self._live_ids(band)
            if ids.numel() == 0:
                continue
            if band in self.token_bands:
                pages = torch.unique(ids // self.ps)
                size = self.entry[band] * self.ps
                s = pool.translate(pages * self.ps, band) // self.ps * size
            else:
                size = self.entry[band]
                s = pool.translate(ids, band) * size
            starts.append(s)
            ends.append(s + size)
            names += [band] * int(s.numel())
        if not starts:
            return []
        s, e = torch.cat(starts), torch.cat(ends)
        out = []
        lo, hi = pool.layout.sink_bytes, pool.layout.total_bytes
        if bool((s < lo).any()) or bool((e > hi).any()):
            out.append(f"a live page lies outside [{lo}, {hi}): starts {s[(s < lo) | (e > hi)][:8].tolist()}")
        order = torch.argsort(s)
        s, e = s[order], e[order]
        clash = torch.nonzero(e[:-1] > s[1:]).flatten()
        if clash.numel():
            i = int(clash[0])
            a, b = names[int(order[i])], names[int(order[i + 1])]
            out.append(f"{clash.numel()} live pages overlap, e.g. {a} [{int(s[i])}, {int(e[i])}) "
                       f"and {b} [{int(s[i + 1])}, {int(e[i + 1])})")
        return out

    def summary(self) -> dict:
        """Op counts and the pool's counters, for reports."""
        st = self.pool.stats()
        return {"ops": self.ops, "counts": dict(self.counts), "shortfalls": self.counts["shortfall"],
                "moves": st["moves"], "flushes": st["flushes"], "relocations": st["relocations"],
                "settles": st["settles"], "ladder_runs": st["ladder_runs"], "live_requests": len(self.reqs)}
