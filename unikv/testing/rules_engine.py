"""The conformance machine's engine rules (a mixin of `ConformanceMachine`):
forwards and engine steps with overlap scheduling, probes of the capacity
views, rejected calls, drains and clears."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from unikv.testing import checks
from unikv.testing.device import buffer_copy, host_ids
from unikv.testing.forward import Forward, plan_io
from unikv.testing.rules_host import MachineHost

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool
    from unikv.testing.shadow import ShadowBytes


class EngineRules(MachineHost):
    """Rules that play the engine's step loop (needs the machine's helpers)."""

    if TYPE_CHECKING:  # what the rules use of `ConformanceMachine` and `MemoryRules`
        shadow: ShadowBytes
        sizes: dict[str, int]

        def new_pool(self) -> UnifiedPool: ...
        def _fire(self) -> None: ...
        def _landed(self, fwd: Forward) -> None: ...
        def _extend(self, data: st.DataObject,
                    olds: list[int] | None = None) -> tuple[list[int], list[int]] | None: ...
        def _decode(self, data: st.DataObject, rids: list[int] | None = None) -> list[int] | None: ...
        def _free_request(self, rid: int) -> None: ...
        def _free_some_pages(self, rid: int, data: st.DataObject) -> None: ...
        def _flush(self, urgent: bool) -> None: ...

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

    def _step_batch(self, data: st.DataObject, running: list[int]) -> tuple[list[int], list[int]]:
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

    def _scheduler_round(self, data: st.DataObject, finished: list[int], first: bool) -> None:
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

    def _draw_state_writes(self, data: st.DataObject) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for band in self.state_bands:
            slots = sorted(self.model.states[band])
            out[band] = data.draw(st.lists(st.sampled_from(slots), unique=True, max_size=3)
                                  if slots else st.just([]), label=f"{band} write slots")
        return out

    def _launch(self, batch: list[int], writes: list[int], states: dict[str, list[int]]) -> None:
        """Declare the forward: plan its I/O at today's physical slots, make
        its event land the writes, tell the pool."""
        fwd = Forward(self.pool.backend.new_event("forward"))
        mine = {t for r in batch for t in self.model.reqs[r].tokens}
        for band in self.token_bands:
            stamps = self.model.stamps[band]
            plan_io(fwd, self.pool, self.model, self.shadow, band, sorted(mine & stamps.keys()),
                    [t for t in writes if t in stamps], self.ps)
        for band, w in states.items():
            plan_io(fwd, self.pool, self.model, self.shadow, band, w, w, 1)
        fwd.event.on_fire(lambda: self._landed(fwd))
        self.inflight = fwd
        self.pool.set_inflight_forward(fwd.event, write_ids=host_ids(writes),
                                       state_write_ids={b: host_ids(w) for b, w in states.items() if w})

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

    def _probe(self, mode: str, data: st.DataObject) -> None:
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
        ids = host_ids(out).tolist()
        self._new_tokens(out, [sorted({t // ps for t in ids})], [rid], [ids])
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
        got = host_ids(ids).tolist()
        assert not set(got) & set(self.model.states[band]), f"alloc_state handed out live slots {got}"
        self._write(band, got)
        if not data.draw(st.booleans(), label="keep"):
            pool.free_state(band, got)
            self.model.free_states(band, got)

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
        assert all(np.array_equal(before[k], after[k]) if isinstance(before[k], np.ndarray)
                   else before[k] == after[k] for k in before), "a rejected call changed the pool"

    def _bad_calls(self, data: st.DataObject) -> list[Callable[[], object]]:
        pool, ps = self.pool, self.ps
        calls: list[Callable[[], object]] = []
        dead = [v for v in range(1, pool.vids.size) if v not in self.model.pages]
        if dead:
            v = data.draw(st.sampled_from(dead), label="dead page")
            calls.append(lambda: pool.free([v * ps]))  # never allocated, or freed already
        if ps > 1:
            calls.append(lambda: pool.alloc(ps + 1))
        for band in self.state_bands:
            calls.append(partial(pool.release, [ps], band=band))
            idle = [s for s in range(1, self.sizes[band]) if s not in self.model.states[band]]
            if idle:
                calls.append(partial(pool.free_state, band, [idle[0]]))
        tails = [r for r in self._reqs(extendable=True) if len(self.model.reqs[r].tokens) % ps]
        if tails:
            toks = self.model.reqs[tails[0]].tokens  # last_loc one slot past the prefix end
            calls.append(lambda: pool.alloc_extend([len(toks)], [len(toks) + 1], [toks[-1] + 1]))
        return calls + self._bad_forward_and_release_calls()

    def _bad_forward_and_release_calls(self) -> list[Callable[[], object]]:
        """Writes without a done event or out of range; a `start_pos` run
        that is not one (issue 14 item 11); a flush with a non-bool mode."""
        pool, ps = self.pool, self.ps
        calls: list[Callable[[], object]] = [partial(pool.flush, urgent="yes")]  # type: ignore[arg-type]
        live = sorted(self.model.pages)
        if self.token_bands:
            calls.append(partial(pool.set_inflight_forward, None, [v * ps for v in live[:1]] or [0]))
            calls.append(partial(pool.set_inflight_forward, object(), [pool.vids.size * ps]))
        for band in self.state_bands:
            calls.append(partial(pool.set_inflight_forward, object(), None, {band: [self.sizes[band]]}))
        if ps > 1 and len(live) >= 2 and self.token_bands:
            # Position 1 claimed on another page than position 0: a stride would skip it.
            run = [live[0] * ps, live[1] * ps + 1]
            calls.append(partial(pool.release, run, band=self.token_bands[0], start_pos=0))
        return calls

    def _snapshot(self) -> dict[str, Any]:
        p = self.pool
        out = {"occ": p.occupancy(), "avail": checks.capacity_views(p), "free": host_ids(p.vids.free).tolist(),
               "stats": {k: v for k, v in p.stats().items() if k != "bands"},
               "forward": (id(p.hazards.event), {k: w.tolist() for k, w in p.hazards.writes.items()})}
        for name, b in p.bands.items():
            out[name] = (host_ids(b.v2p).tolist(), host_ids(b.p2v).tolist())
        if p.buffer is not None:
            out["bytes"] = buffer_copy(p)
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
        errs = checks.fresh_violations(self.pool, self.new_pool())
        assert not errs, "\n".join(errs)

    @rule()
    def clear(self):
        """clear() (after the forward finished) gives a fresh pool."""
        self._op()
        self._fire()
        self.pool.clear()
        self.model.clear()
        errs = checks.fresh_violations(self.pool, self.new_pool())
        assert not errs, "\n".join(errs)
