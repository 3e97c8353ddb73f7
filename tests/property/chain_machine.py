"""One hypothesis state machine for the chain invariants, for every pool kind.

`ChainMachine` draws a layout in its `@initialize` (chain_setup.layouts),
then plays the serving engine through the public surface: plain, batched
extend and decode allocs with tail-page reuse, frees of whole requests and
of page subsets, releases of one band (window ratchet with and without
`start_pos`), state slots, flushes, the float's relocations, in-flight
forwards and their events (including engine steps with overlap scheduling),
probes of the capacity views, rejected calls, drains and clears.

Beside the pool it steps `ChainModel`, a plain-Python record of what the
engine holds, and on materialised buffers `ShadowBytes`, the bytes every
written slot must read back. Writes go through translate + buffer_view; a
forward's writes land when its event fires, at the physical slots its ids
had at launch, and its reads are checked there (so a wrong move or an
early reuse shows up as corrupted bytes). After every rule `healthy()` runs
the public checkers of chain_checks.

`machine_for(kind)` gives the machine of one pool kind: "eager" and "lazy"
(`UnifiedPool`), "static" (`StaticPartitionPool`) and "oracle" (`OraclePool`,
not materialisable: no byte or overlap checks).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import chain_checks as checks
import torch
from chain_model import ChainModel
from chain_setup import CHAINS, KINDS, fit_layout, ids_tensor, known_core_bug, layouts, make_pool
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

# Reported by conftest: rule steps and examples per machine class, and what
# the runs reached (pool counters summed over examples, hazard situations,
# known bugs stepped around).
STEPS: collections.Counter = collections.Counter()
EXAMPLES: collections.Counter = collections.Counter()
REACHED: collections.Counter = collections.Counter()
_COUNTERS = ("moves", "relocations", "ladder_runs", "ladder_failures", "settles", "absorbed_pages",
             "pending_peak")


@dataclass
class Forward:
    """A launched forward: its event, what it touches, and its I/O at the
    physical slots its ids had at launch."""

    event: object
    pages: set = field(default_factory=set)  # virtual token pages it reads or writes
    states: set = field(default_factory=set)  # (band, slot id)
    reads: list = field(default_factory=list)  # (band, physical slots, rows expected there)
    writes: list = field(default_factory=list)  # (band, ids, physical slots, stamps, is_state)


class ChainMachine(RuleBasedStateMachine):
    """The engine against one pool, with a reference model beside it."""

    kind = "lazy"
    chains = CHAINS

    def __init__(self) -> None:
        super().__init__()
        self.pool = None

    @initialize(data=st.data())
    def setup(self, data):
        EXAMPLES[type(self).__name__] += 1
        self.layout = fit_layout(self.kind, data.draw(layouts(self.chains), label="layout"))
        bug = known_core_bug(self.kind, self.layout)
        if bug:
            REACHED[f"known bug stepped around: {bug}"] += 1
        assume(bug is None)
        self.move_cap = 4096
        if self.kind == "lazy":
            self.move_cap = data.draw(st.sampled_from([1, 2, 4096]), label="move_cap")
        self.pool = pool = make_pool(self.kind, self.layout, self.move_cap)
        self.ps = pool.page_size
        self.token_bands = [b.name for b in self.layout.token_bands]
        self.state_bands = [b.name for b in self.layout.state_bands]
        self.has_float = self.kind in ("eager", "lazy") and len(self.layout.bands) == 3
        self.window = "swa" if "swa" in self.token_bands else self.token_bands[0]
        # Pages of a coupled alloc the empty buffer could take (+1: a shortfall).
        self.max_pages = 1 + (self.layout.total_bytes - self.layout.sink_bytes) // sum(
            b.page_bytes for b in self.layout.token_bands)
        self.sizes = {n: pool.vids.size * self.ps for n in self.token_bands}
        self.sizes.update({n: pool.state_ids[n].size for n in self.state_bands})
        self.shadow = checks.ShadowBytes(pool, self.sizes)
        self.model = ChainModel(self.token_bands, self.state_bands, self.ps)
        self.stamp = 1
        self.inflight: Forward | None = None
        self.late: list[str] = []  # violations seen inside event callbacks

    # -- helpers --

    def _op(self) -> None:
        STEPS[type(self).__name__] += 1

    def _moves(self) -> int:
        return self.pool.stats()["moves"]

    def _stamps(self, n: int) -> torch.Tensor:
        out = torch.arange(self.stamp, self.stamp + n, dtype=torch.int64)
        self.stamp += n
        return out

    def _write(self, band: str, ids: list[int], state: bool = False) -> None:
        """Write fresh patterns into `ids` of `band` through translate."""
        if not ids:
            return
        t, stamps = ids_tensor(ids), self._stamps(len(ids))
        phys = self.pool.translate(t, band) if self.shadow.materialized else None
        self.shadow.write(band, t, phys, stamps)
        target = self.model.states[band] if state else self.model.stamps[band]
        target.update(zip(ids, stamps.tolist()))

    def _new_tokens(self, out: torch.Tensor, fresh: list[list[int]], rids: list[int],
                    tokens: list[list[int]]) -> None:
        """Record a successful token alloc in the model; write its bytes on
        every token band that binds the page (a tail page may be released)."""
        for rid, pages, toks in zip(rids, fresh, tokens):
            self.model.bind(pages, rid)
            self.model.reqs[rid].tokens += toks
        ids = out.tolist()
        for band in self.token_bands:
            self._write(band, [t for t in ids if band in self.model.pages[t // self.ps].bands])

    def _reqs(self, extendable: bool = False, live: bool = False) -> list[int]:
        m = self.model
        return sorted(r for r in m.reqs
                      if (not extendable or m.extendable(r)) and (not live or m.live_pages(r)))

    def _room(self) -> list[int]:
        return [self.pool.available_size()] + [self.pool.available_state(b) for b in self.state_bands]

    def _shortfall(self, room_before: list[int], what: str) -> None:
        """An alloc returned None: the ladder may have moved pages, but must
        not leave less no-move room than it found."""
        room = self._room()
        assert all(a >= b for a, b in zip(room, room_before)), \
            f"a failed {what} shrank the room {room_before} -> {room}"

    def _live_map(self) -> dict:
        """band -> physical page of every live page (to see that nothing moved)."""
        return {band: self.pool.translate(ids_tensor(sorted(self.model.bound(band))) * self.ps, band).tolist()
                for band in self.token_bands}

    # -- token allocs --

    @rule(data=st.data())
    def alloc(self, data):
        """Plain alloc of a new request: page-structured ids on free pages."""
        self._op()
        k = data.draw(st.integers(0, self.max_pages), label="pages")
        room = self._room()
        out = self.pool.alloc(k * self.ps)
        if out is None:
            return self._shortfall(room, f"alloc({k * self.ps})")
        rows = out.reshape(k, self.ps)
        pages = rows[:, 0] // self.ps
        assert torch.equal(rows, pages[:, None] * self.ps + torch.arange(self.ps)), \
            f"alloc({k * self.ps}) ids are not page-structured: {out.tolist()}"
        fresh = pages.tolist()
        assert len(set(fresh)) == k and not set(fresh) & set(self.model.pages) and 0 not in fresh, \
            f"alloc handed out pages {fresh}; live {sorted(self.model.pages)}"
        self._new_tokens(out, [fresh], [self.model.new_request()], [out.tolist()])

    @rule(data=st.data())
    def extend(self, data):
        """Batched alloc_extend: chunked prefill of live requests (tail page
        reused) plus new requests with prefix 0."""
        self._op()
        self._extend(data)

    def _extend(self, data, olds: list[int] | None = None) -> tuple[list[int], list[int]] | None:
        """One alloc_extend; the batch's request ids and new token ids, or
        None on a shortfall."""
        if olds is None:
            olds = data.draw(st.lists(st.sampled_from(self._reqs(extendable=True)), unique=True, max_size=3)
                             if self._reqs(extendable=True) else st.just([]), label="requests")
        new = data.draw(st.integers(0 if olds else 1, 2), label="new requests")
        most = max(2 * self.ps + 3, self.max_pages * self.ps // 2)
        adds = [data.draw(st.integers(0, most), label="tokens") for _ in range(len(olds) + new)]
        reqs = [self.model.reqs[r] for r in olds]
        prefix = [len(r.tokens) for r in reqs] + [0] * new
        seq = [p + a for p, a in zip(prefix, adds)]
        last = [r.tokens[-1] if r.tokens else 0 for r in reqs] + [0] * new
        hint = data.draw(st.booleans(), label="pass extend_num_tokens")
        room = self._room()
        out = self.pool.alloc_extend(prefix, seq, last, sum(adds) if hint else None)
        if out is None:
            self._shortfall(room, "alloc_extend")
            return None
        errs, fresh = checks.paged_violations(prefix, seq, last, out, self.ps, set(self.model.pages))
        assert not errs, "\n".join(errs)
        rids = olds + [self.model.new_request() for _ in range(new)]
        ids, chunks = out.tolist(), []
        for a in adds:
            chunks.append(ids[:a])
            ids = ids[a:]
        self._new_tokens(out, fresh, rids, chunks)
        return rids, out.tolist()

    @precondition(lambda self: self._reqs(extendable=True))
    @rule(data=st.data())
    def decode(self, data):
        """alloc_decode: one token for each of a batch of live requests."""
        self._op()
        self._decode(data)

    def _decode(self, data, rids: list[int] | None = None) -> list[int] | None:
        if rids is None:
            rids = data.draw(st.lists(st.sampled_from(self._reqs(extendable=True)), unique=True,
                                      min_size=1, max_size=6), label="batch")
        if not rids:
            return None
        reqs = [self.model.reqs[r] for r in rids]
        seq = [len(r.tokens) + 1 for r in reqs]
        last = [r.tokens[-1] if r.tokens else 0 for r in reqs]
        room = self._room()
        out = self.pool.alloc_decode(seq, last)
        if out is None:
            self._shortfall(room, "alloc_decode")
            return None
        prefix = [s - 1 for s in seq]
        errs, fresh = checks.paged_violations(prefix, seq, last, out, self.ps, set(self.model.pages))
        assert not errs, "\n".join(errs)
        self._new_tokens(out, fresh, rids, [[t] for t in out.tolist()])
        return rids

    # -- frees and releases --

    @precondition(lambda self: self.model.reqs)
    @rule(data=st.data())
    def free_request(self, data):
        """Finish a request: free every live page of it."""
        self._op()
        self._free_request(data.draw(st.sampled_from(self._reqs()), label="request"))

    def _free_request(self, rid: int) -> None:
        ids = [t for t in self.model.reqs[rid].tokens if self.model.owns(rid, t // self.ps)]
        self._settle_for(self.model.live_pages(rid))
        m0 = self._moves()
        moves = self.pool.free(ids_tensor(ids))
        assert moves == self._moves() - m0, f"free returned {moves} moves, stats say {self._moves() - m0}"
        self.model.drop_request(rid)

    @precondition(lambda self: self._reqs(live=True))
    @rule(data=st.data())
    def free_pages(self, data):
        """Free a random subset of one request's pages (any id of a page)."""
        self._op()
        self._free_some_pages(data.draw(st.sampled_from(self._reqs(live=True)), label="request"), data)

    def _free_some_pages(self, rid: int, data) -> None:
        pages = data.draw(st.lists(st.sampled_from(self.model.live_pages(rid)), min_size=1, unique=True),
                          label="pages")
        toks = self.model.reqs[rid].tokens
        ids = [data.draw(st.sampled_from([t for t in toks if t // self.ps == v]), label="id") for v in pages]
        self._settle_for(pages)
        m0 = self._moves()
        assert self.pool.free(ids) == self._moves() - m0
        self.model.free(pages)

    @precondition(lambda self: len(self.token_bands) > 1 and self._reqs(live=True))
    @rule(data=st.data())
    def ratchet(self, data):
        """Window ratchet on the swa band: release the request's positions
        that left a window of W tokens, from the first one still bound there
        (its ids may start mid-page)."""
        self._op()
        rid = data.draw(st.sampled_from(self._reqs(live=True)), label="request")
        window = data.draw(st.integers(0, 2 * self.ps + 3), label="window")
        toks, bound = self.model.reqs[rid].tokens, self.model.bound(self.window)
        live = set(self.model.live_positions(rid))
        start = next((i for i in sorted(live) if toks[i] // self.ps in bound), None)
        cut = (len(toks) - window) // self.ps * self.ps
        end = start
        while start is not None and end < cut and end in live:
            end += 1
        if start is None or end <= start:
            return
        offset = data.draw(st.integers(0, min(self.ps - 1, end - start - 1)), label="offset")
        self._release(self.window, toks[start + offset:end], start + offset, data)

    @precondition(lambda self: len(self.token_bands) > 1 and self._reqs(live=True))
    @rule(data=st.data())
    def release_pages(self, data):
        """Tombstone a contiguous run of one request's positions on any token
        band (pages already released there are skipped)."""
        self._op()
        rid = data.draw(st.sampled_from(self._reqs(live=True)), label="request")
        band = data.draw(st.sampled_from(self.token_bands), label="band")
        live = self.model.live_positions(rid)
        start = data.draw(st.sampled_from(live), label="start")
        end, live_set = start + 1, set(live)
        while end in live_set:
            end += 1
        end = data.draw(st.integers(start + 1, end), label="end")
        self._release(band, self.model.reqs[rid].tokens[start:end], start, data)

    def _release(self, band: str, run: list[int], start: int, data) -> None:
        pages = sorted({t // self.ps for t in run})
        self._settle_for(pages)
        m0 = self._moves()
        if data.draw(st.booleans(), label="start_pos"):
            moves = self.pool.release(run, band=band, start_pos=start)
        else:
            moves = self.pool.release(data.draw(st.permutations(run), label="ids"), band=band)
        assert moves == self._moves() - m0
        self.model.release(band, pages)

    # -- state slots --

    @precondition(lambda self: self.state_bands)
    @rule(data=st.data())
    def alloc_state(self, data):
        self._op()
        band = data.draw(st.sampled_from(self.state_bands), label="band")
        n = data.draw(st.integers(0, 3), label="slots")
        room = self._room()
        ids = self.pool.alloc_state(band, n)
        if ids is None:
            return self._shortfall(room, f"alloc_state({band}, {n})")
        got = ids.tolist()
        assert len(set(got)) == n and not set(got) & set(self.model.states[band]) and 0 not in got, \
            f"alloc_state handed out {got}; live {sorted(self.model.states[band])}"
        self._write(band, got, state=True)

    @precondition(lambda self: any(self.model.states.values()))
    @rule(data=st.data())
    def free_state(self, data):
        self._op()
        band = data.draw(st.sampled_from([b for b in self.state_bands if self.model.states[b]]), label="band")
        ids = data.draw(st.lists(st.sampled_from(sorted(self.model.states[band])), min_size=1, unique=True),
                        label="slots")
        self._settle_for(states={(band, s) for s in ids})
        m0 = self._moves()
        assert self.pool.free_state(band, ids) == self._moves() - m0
        for s in ids:
            del self.model.states[band][s]

    # -- maintenance --

    @rule(urgent=st.booleans())
    def flush(self, urgent):
        """flush(urgent) returns its moves; an urgent flush realises at least
        the urgent-flush part of the schedulable view (the float slide is
        the ladder's, checked by `probe_schedulable`) and an idle flush never
        shrinks available_size()."""
        self._op()
        self._flush(urgent)

    def _flush(self, urgent: bool) -> None:
        idle, pool = self.inflight is None, self.pool
        before = pool.available_size()
        # The chain's urgent-flush view (no float slide): what a flush alone realises.
        sched = pool.chain.joint_pages(pool.token_order, schedulable=True) * self.ps if pool.token_names else 0
        holes = sum(b["hole_pages"] for b in pool.occupancy()["bands"].values())
        m0 = self._moves()
        moves = pool.flush(urgent=urgent)
        assert moves == self._moves() - m0, f"flush returned {moves}, stats moved {self._moves() - m0}"
        if not urgent and not idle:
            REACHED.update({"non-urgent flushes under a forward": 1,
                            "... with holes": int(holes > 0), "... moving pages": int(moves > 0)})
        after = pool.available_size()
        if urgent:
            assert after >= sched, f"urgent flush left available_size {after} < the urgent-flush view {sched}"
        elif idle:
            assert after >= before, f"idle flush shrank available_size {before} -> {after}"

    @precondition(lambda self: self.has_float)
    @rule(side=st.sampled_from(["low", "high"]), data=st.data())
    def make_room(self, side, data):
        """make_room opens what it reports (checked against occupancy); when
        it reports failure the float's free bytes are short and nothing moved."""
        self._op()
        total = self.layout.total_bytes
        min_bytes = data.draw(st.one_of(st.integers(0, total // 8), st.integers(0, total)), label="min_bytes")
        before, m0 = self._live_map(), self._moves()
        got = self.pool.make_room(side, min_bytes)
        occ = self.pool.occupancy()["bands"]
        below, flt, above = (occ[n] for n in self.layout.names)
        if got < min_bytes:
            assert self._moves() == m0 and self._live_map() == before, \
                f"make_room({side}, {min_bytes}) failed ({got}) but moved pages"
            free = self._float_free_bytes(occ)
            assert free < min_bytes, f"make_room({side}, {min_bytes}) gave up at {got}; {free} bytes are free"
        elif not flt["transparent"]:
            gap = (flt["low_byte"] - below["high_byte"] if side == "low"
                   else above["low_byte"] - flt["high_byte"])
            assert gap >= got, f"make_room({side}) reports {got} open bytes, occupancy shows {gap}"

    def _float_free_bytes(self, occ: dict) -> int:
        """Free whole pages of the float's grid between its neighbours, in
        bytes, from occupancy and the layout's geometry."""
        low, name, high = self.layout.names
        g = self.layout.geometry(name)
        lo = max(g.min_page, -(-occ[low]["high_byte"] // g.page_bytes))
        hi = min(g.num_pages, occ[high]["low_byte"] // g.page_bytes)
        return max(0, hi - lo - occ[name]["live_pages"]) * g.page_bytes

    @precondition(lambda self: self.has_float)
    @rule(side=st.sampled_from(["low", "high"]))
    def compact_holes(self, side):
        """compact_holes returns its moves and leaves the float dense."""
        self._op()
        m0 = self._moves()
        assert self.pool.compact_holes(side) == self._moves() - m0
        flt = self.pool.occupancy()["bands"][self.layout.names[1]]
        assert flt["hole_pages"] == 0 and flt["occupied_bytes"] == flt["live_bytes"], \
            f"compact_holes({side}) left {flt}"

    # -- forwards --

    @precondition(lambda self: self.model.pages or any(self.model.states.values()))
    @rule(data=st.data())
    def launch(self, data):
        """set_inflight_forward over a batch of requests: it reads every
        written slot of the batch and writes some of them, plus some state
        slots (the engine finishes the previous forward first)."""
        self._op()
        self._fire()
        live = self._reqs(live=True)
        batch = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=4) if live else st.just([]),
                          label="batch")
        mine = self._written(batch)
        writes = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=8) if mine else st.just([]),
                           label="write ids")
        self._launch(batch, writes, self._draw_state_writes(data))

    @precondition(lambda self: self.inflight is not None)
    @rule()
    def fire(self):
        """The in-flight forward finishes."""
        self._op()
        self._fire()

    @precondition(lambda self: self._reqs(live=True))
    @rule(data=st.data())
    def overlap_step(self, data):
        """An engine step with overlap scheduling. Requests that finished
        last step (one or two, when others run) leave the batch; the rest
        (or some) decode, or a few prefill a chunk (with new requests), and
        the forward launches: it reads the batch and writes its new tokens,
        or some slots, or none. While it runs, for 1-4 rounds, the scheduler
        frees a finished request (or some of its pages), flushes
        non-urgently and admits new tokens. The forward stays in flight."""
        self._op()
        self._fire()
        live = self._reqs(live=True)
        finished = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=int(len(live) > 1),
                                      max_size=2), label="finished")
        batch, new = self._step_batch(data, [r for r in self._reqs(extendable=True) if r not in finished])
        mode = data.draw(st.sampled_from(["new tokens", "some", "none"]), label="forward writes")
        mine = self._written(batch)
        if mode == "new tokens":
            writes = new
        elif mode == "some" and mine:
            writes = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=4), label="write ids")
        else:
            writes = []
        if batch:
            self._launch(batch, writes, self._draw_state_writes(data))
        for i in range(data.draw(st.integers(1, 4), label="scheduler rounds")):
            self._scheduler_round(data, [r for r in finished if r in self.model.reqs], first=i == 0)

    def _step_batch(self, data, running: list[int]) -> tuple[list[int], list[int]]:
        """Decode `running` (or a subset), or prefill a chunk of a few of
        them; the batch and its new token ids (none on a shortfall)."""
        if not data.draw(st.booleans(), label="whole batch") and running:
            running = data.draw(st.lists(st.sampled_from(running), unique=True, min_size=1), label="batch")
        if data.draw(st.booleans(), label="prefill step"):
            got = self._extend(data, olds=running[:3])
            return got if got is not None else (running, [])
        if self._decode(data, running):
            return running, [self.model.reqs[r].tokens[-1] for r in running]
        return running, []

    def _scheduler_round(self, data, finished: list[int], first: bool) -> None:
        """Free (some of) a finished request (always in the first round),
        flush non-urgently, maybe admit new tokens."""
        ways = ["a request", "some pages"] if first else ["nothing", "a request", "some pages"]
        how = data.draw(st.sampled_from(ways) if finished else st.just("nothing"), label="free")
        if how == "a request":
            self._free_request(data.draw(st.sampled_from(finished), label="request"))
        elif how == "some pages" and any(self.model.live_pages(r) for r in finished):
            live = [r for r in finished if self.model.live_pages(r)]
            rid = data.draw(st.sampled_from(live), label="request")
            self._free_some_pages(rid, data)
        self._flush(urgent=False)
        if data.draw(st.booleans(), label="admit"):
            self._extend(data)

    def _written(self, batch: list[int]) -> list[int]:
        """Token ids of `batch` with bytes written on some band."""
        return sorted({t for r in batch for t in self.model.reqs[r].tokens} & set(self.model.live_tokens()))

    def _draw_state_writes(self, data) -> dict:
        out = {}
        for band in self.state_bands:
            slots = sorted(self.model.states[band])
            out[band] = data.draw(st.lists(st.sampled_from(slots), unique=True, max_size=3)
                                  if slots else st.just([]), label=f"{band} write slots")
        return out

    def _launch(self, batch: list[int], writes: list[int], states: dict) -> None:
        """Declare the forward: plan its I/O at today's physical slots, make
        its event land the writes, tell the pool."""
        fwd = Forward(self.pool.backend.new_event("forward"))
        mine = {t for r in batch for t in self.model.reqs[r].tokens}
        for band in self.token_bands:
            stamps = self.model.stamps[band]
            reads = sorted(mine & stamps.keys())
            fwd.pages |= {t // self.ps for t in reads}
            self._plan(fwd, band, reads, [t for t in writes if t in stamps], state=False)
        for band, w in states.items():
            fwd.states |= {(band, s) for s in w}
            self._plan(fwd, band, w, w, state=True)
        fwd.event.on_fire(lambda: self._landed(fwd))
        self.inflight = fwd
        self.pool.set_inflight_forward(fwd.event, write_ids=ids_tensor(writes),
                                       state_write_ids={b: ids_tensor(w) for b, w in states.items() if w})

    def _plan(self, fwd: Forward, band: str, reads: list[int], writes: list[int], state: bool) -> None:
        if self.shadow.materialized and reads:
            r = ids_tensor(reads)
            fwd.reads.append((band, self.pool.translate(r, band), self.shadow.expected(band, r)))
        if writes:
            w = ids_tensor(writes)
            phys = self.pool.translate(w, band) if self.shadow.materialized else None
            fwd.writes.append((band, w, phys, self._stamps(len(writes)), state))

    def _landed(self, fwd: Forward) -> None:
        """The event fired (from a rule, or a settle inside the pool): the
        forward's reads must have been undisturbed; its writes land at the
        slots its ids had at launch."""
        if self.inflight is fwd:
            self.inflight = None
        for band, phys, rows in fwd.reads:
            got = self.shadow.read(band, phys)
            if not torch.equal(got, rows):
                bad = (got != rows).any(1)
                self.late.append(f"[{band}] read hazard: slots {phys[bad][:8].tolist()} changed "
                                 "while the forward read them")
        for band, ids, phys, stamps, state in fwd.writes:
            self.shadow.write(band, ids, phys, stamps)
            target = self.model.states[band] if state else self.model.stamps[band]
            target.update(zip(ids.tolist(), stamps.tolist()))

    def _fire(self) -> None:
        if self.inflight is not None:
            self.inflight.event.fire()

    def _settle_for(self, pages=(), states=()) -> None:
        """The engine never frees what the running forward touches: it
        waits for the forward first."""
        f = self.inflight
        if f is not None and (not f.pages.isdisjoint(pages) or not f.states.isdisjoint(states)):
            self._fire()

    # -- capacity probes --

    @rule(data=st.data())
    def probe_available(self, data):
        """alloc(n) for n <= available_size() fits with no ladder, no move."""
        self._probe("exact" if data.draw(st.booleans(), label="exact") else "below", data)

    @rule(data=st.data())
    def probe_above(self, data):
        """alloc(available_size() + page_size) fits only through the ladder,
        else returns None (nothing allocated, every live page intact)."""
        self._probe("above", data)

    @rule(data=st.data())
    def probe_schedulable(self, data):
        """alloc(available_size(schedulable=True)) fits: the schedulable view
        is what the ladder realises."""
        self._probe("schedulable", data)

    def _probe(self, mode: str, data) -> None:
        self._op()
        ps, pool = self.ps, self.pool
        n = pool.available_size()
        if mode == "below":
            want = data.draw(st.integers(0, n // ps), label="pages") * ps
        else:
            want = {"exact": n, "above": n + ps, "schedulable": pool.available_size(schedulable=True)}[mode]
        s0, room = pool.stats(), self._room()
        out = pool.alloc(want)
        s1 = pool.stats()
        self._check_probe(mode, f"alloc({want}) with available_size() = {n}", out is not None, s0, s1)
        if out is None:
            return self._shortfall(room, f"alloc({want})")
        rid = self.model.new_request()
        self._new_tokens(out, [sorted({t // ps for t in out.tolist()})], [rid], [out.tolist()])
        if not data.draw(st.booleans(), label="keep"):
            self.pool.free(out)
            self.model.drop_request(rid)

    @precondition(lambda self: self.state_bands)
    @rule(data=st.data())
    def probe_state(self, data):
        """available_state() is exact (n fits with no ladder, n + 1 only
        through it) and the schedulable view is what the ladder realises."""
        self._op()
        band = data.draw(st.sampled_from(self.state_bands), label="band")
        pool = self.pool
        n = pool.available_state(band)
        mode = data.draw(st.sampled_from(["exact", "above", "schedulable"]), label="mode")
        want = {"exact": n, "above": n + 1, "schedulable": pool.available_state(band, schedulable=True)}[mode]
        s0, room = pool.stats(), self._room()
        ids = pool.alloc_state(band, want)
        s1 = pool.stats()
        call = f"alloc_state({band}, {want}) with available_state() = {n}"
        self._check_probe(mode, call, ids is not None, s0, s1)
        if ids is None:
            return self._shortfall(room, f"alloc_state({band}, {want})")
        got = ids.tolist()
        assert not set(got) & set(self.model.states[band]), f"alloc_state handed out live slots {got}"
        self._write(band, got, state=True)
        if not data.draw(st.booleans(), label="keep"):
            pool.free_state(band, got)
            for s in got:
                del self.model.states[band][s]

    def _check_probe(self, mode: str, call: str, ok: bool, s0: dict, s1: dict) -> None:
        ladder, moved = s1["ladder_runs"] - s0["ladder_runs"], s1["moves"] - s0["moves"]
        if mode in ("exact", "below"):
            assert ok and ladder == 0 and moved == 0, f"{call}: fit={ok}, ladder runs {ladder}, moves {moved}"
        elif mode == "above" and ok:
            assert ladder == 1 and s1["ladder_failures"] == s0["ladder_failures"], \
                f"{call} fit without the ladder: the capacity view is short"
        elif mode == "schedulable":
            assert ok, f"{call}: the schedulable view was not realised"

    # -- bad input --

    @rule(data=st.data())
    def bad_call(self, data):
        """A call rejected for bad arguments raises ValueError and leaves the
        pool unchanged (tables, free ids, occupancy, counters, bytes)."""
        self._op()
        calls = self._bad_calls(data)
        if not calls:
            return
        call = data.draw(st.sampled_from(calls), label="call")
        before = self._snapshot()
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("a bad call was accepted")
        after = self._snapshot()
        assert all(torch.equal(before[k], after[k]) if isinstance(before[k], torch.Tensor)
                   else before[k] == after[k] for k in before), "a rejected call changed the pool"

    def _bad_calls(self, data) -> list:
        pool, ps, calls = self.pool, self.ps, []
        dead = [v for v in range(1, pool.vids.size) if v not in self.model.pages]
        if dead:
            v = data.draw(st.sampled_from(dead), label="dead page")
            calls.append(lambda: pool.free([v * ps]))  # never allocated, or freed already
        if ps > 1:
            calls.append(lambda: pool.alloc(ps + 1))
        for band in self.state_bands:
            calls.append(lambda band=band: pool.release([ps], band=band))
            idle = [s for s in range(1, self.sizes[band]) if s not in self.model.states[band]]
            if idle:
                calls.append(lambda band=band, s=idle[0]: pool.free_state(band, [s]))
        tails = [r for r in self._reqs(extendable=True) if len(self.model.reqs[r].tokens) % ps]
        if tails:
            toks = self.model.reqs[tails[0]].tokens  # last_loc one slot past the prefix end
            calls.append(lambda: pool.alloc_extend([len(toks)], [len(toks) + 1], [toks[-1] + 1]))
        return calls

    def _snapshot(self) -> dict:
        p = self.pool
        out = {"occ": p.occupancy(), "avail": checks.capacity_views(p), "free": p.vids.free.tolist(),
               "stats": {k: v for k, v in p.stats().items() if k != "bands"}}
        for name, b in p.bands.items():
            out[name] = (b.v2p.tolist(), b.p2v.tolist())
        if p.buffer is not None:
            out["bytes"] = p.buffer.clone()
        return out

    # -- drain / clear --

    @rule()
    def drain(self):
        """Free everything and flush urgently: the pool equals a fresh one."""
        self._op()
        self._fire()
        for rid in self._reqs():
            self._free_request(rid)
        for band in self.state_bands:
            if self.model.states[band]:
                self.pool.free_state(band, sorted(self.model.states[band]))
                self.model.states[band].clear()
        self.pool.flush(urgent=True)
        errs = checks.fresh_violations(self.pool, make_pool(self.kind, self.layout, self.move_cap))
        assert not errs, "\n".join(errs)

    @rule()
    def clear(self):
        """clear() (after the forward finished) gives a fresh pool."""
        self._op()
        self._fire()
        self.pool.clear()
        self.model.clear()
        errs = checks.fresh_violations(self.pool, make_pool(self.kind, self.layout, self.move_cap))
        assert not errs, "\n".join(errs)

    # -- after every rule --

    @invariant()
    def healthy(self):
        if self.pool is None:
            return
        out, self.late = self.late, []
        out += self.pool.verify()
        out += checks.table_violations(self.pool, self.model)
        out += checks.kernel_id_violations(self.pool, self.model)
        out += checks.byte_violations(self.pool, self.model, self.shadow)
        if self.kind != "oracle":  # its physical ids are bookkeeping only
            out += checks.overlap_violations(self.pool, self.model)
        out += checks.capacity_violations(self.pool)
        assert not out, "\n".join(out)

    def teardown(self):
        if self.pool is not None:
            self._fire()
            stats = self.pool.stats()
            REACHED.update({k: stats[k] for k in _COUNTERS})


def machine_for(kind: str, chains=CHAINS, name: str | None = None) -> type:
    """The state machine for pool `kind` (see `KINDS`), over `chains` (a
    subset of `CHAINS`)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    return type(name or f"ChainMachine_{kind}", (ChainMachine,), {"kind": kind, "chains": tuple(chains)})
