"""The conformance machine's memory rules (a mixin of `ConformanceMachine`):
token allocs, frees and releases, state slots, flushes and the float's
relocations. Each rule calls the pool, checks what the call returned and
steps the reference model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from unikv.testing import checks
from unikv.testing.device import host_ids
from unikv.testing.reach import REACHED
from unikv.testing.rules_host import MachineHost

if TYPE_CHECKING:
    from unikv.layout import Layout
    from unikv.testing.forward import Pair


class MemoryRules(MachineHost):
    """Rules over the pool's memory surface (needs the machine's helpers)."""

    if TYPE_CHECKING:  # what the rules use of `ConformanceMachine` (all set in its setup)
        layout: Layout
        window: str
        has_float: bool
        max_pages: int

        def _moves(self) -> int: ...
        def _live_map(self) -> dict[str, list[int]]: ...
        def _settle_for(self, pages: Iterable[int] = (), states: Iterable[Pair] = ()) -> None: ...

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
        rows = host_ids(out).reshape(k, self.ps)
        pages = rows[:, 0] // self.ps
        assert np.array_equal(rows, pages[:, None] * self.ps + np.arange(self.ps)), \
            f"alloc({k * self.ps}) ids are not page-structured: {rows.reshape(-1).tolist()}"
        fresh = pages.tolist()
        assert len(set(fresh)) == k and not set(fresh) & set(self.model.pages) and 0 not in fresh, \
            f"alloc handed out pages {fresh}; live {sorted(self.model.pages)}"
        self._new_tokens(out, [fresh], [self.model.new_request()], [rows.reshape(-1).tolist()])

    @rule(data=st.data())
    def extend(self, data):
        """Batched alloc_extend: chunked prefill of live requests (tail page
        reused) plus new requests with prefix 0."""
        self._op()
        self._extend(data)

    def _extend(self, data: st.DataObject, olds: list[int] | None = None) -> tuple[list[int], list[int]] | None:
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
        ids, chunks = host_ids(out).tolist(), []
        all_ids = list(ids)
        for a in adds:
            chunks.append(ids[:a])
            ids = ids[a:]
        self._new_tokens(out, fresh, rids, chunks)
        return rids, all_ids

    @precondition(lambda self: self._reqs(extendable=True))
    @rule(data=st.data())
    def decode(self, data):
        """alloc_decode: one token for each of a batch of live requests."""
        self._op()
        self._decode(data)

    def _decode(self, data: st.DataObject, rids: list[int] | None = None) -> list[int] | None:
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
        self._new_tokens(out, fresh, rids, [[t] for t in host_ids(out).tolist()])
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
        moves = self.pool.free(np.asarray(ids, dtype=np.int64))
        assert moves == self._moves() - m0, f"free returned {moves} moves, stats say {self._moves() - m0}"
        self.model.drop_request(rid)

    @precondition(lambda self: self._reqs(live=True))
    @rule(data=st.data())
    def free_pages(self, data):
        """Free a random subset of one request's pages (any id of a page)."""
        self._op()
        self._free_some_pages(data.draw(st.sampled_from(self._reqs(live=True)), label="request"), data)

    def _free_some_pages(self, rid: int, data: st.DataObject) -> None:
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

    def _release(self, band: str, run: list[int], start: int, data: st.DataObject) -> None:
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
        got = host_ids(ids).tolist()
        assert len(set(got)) == n and not set(got) & set(self.model.states[band]) and 0 not in got, \
            f"alloc_state handed out {got}; live {sorted(self.model.states[band])}"
        self._write(band, got)

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
        self.model.free_states(band, ids)

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
