"""The SimPy engine: an arrival process and one scheduler process.

One scheduler iteration is one engine step: admit waiting requests FCFS
while their next chunk and state slot fit, allocate prefill chunks and one
decode token per running request (evicting cached prefixes, then retracting
the newest request on a shortfall), launch the forward, flush
opportunistically while it runs, advance time by the cost model, then finish
requests and ratchet the sliding window.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

import simpy
from unikv.sim.memory import Memory, int64_ids
from unikv.sim.recorder import Recorder
from unikv.sim.request import Request


class Simulation:
    """All state of one run; processes are methods of this object.

    Args:
        requests: trace requests sorted by arrival.
        memory: the request-level memory layer (owns the pool).
        step_cost: (prefill_tokens, decode_tokens, kv_bytes_read, moved_bytes)
            -> seconds of one engine step.
        kv_bytes: batch -> KV bytes its attention reads per step (with
            `from_totals`, as `sim.run.KVRead`, read from the running
            requests' totals when the batch is all of them).
        max_running, prefill_tokens_per_step: scheduler knobs.
        max_tokens: the longest request (prompt + output) the layout can ever
            hold; longer ones are rejected.
        reserve: (initial, minimum, decay per step) of the decode reserve
            ratio: admission keeps room for that share of the tokens running
            requests have yet to produce; a retraction resets it to the
            initial value (SGLang's new_token_ratio).
        check_every: run the accounting checks every N steps (0 = never).
        is_oracle: the unusable-free ratio is 0 by definition.
        progress: called with the number of finished requests, or None.
    """

    def __init__(self, requests: list[Request], memory: Memory, *, step_cost: Callable,
                 kv_bytes: Callable[[list[Request]], int], max_running: int,
                 prefill_tokens_per_step: int, max_tokens: int,
                 reserve: tuple[float, float, float] = (0.0, 0.0, 0.0), check_every: int = 0,
                 is_oracle: bool = False, progress: Callable[[int], None] | None = None) -> None:
        self.env = simpy.Environment()
        self.requests = requests
        self.mem = memory
        self.pool = memory.pool
        self.ps = self.pool.page_size
        self.step_cost = step_cost
        self.kv_bytes = kv_bytes
        # A reader that takes totals (sim.run.KVRead) over the same window as
        # the memory layer: a batch of every running request reads from the
        # totals Memory keeps instead of a walk.
        self._kv_totals = getattr(kv_bytes, "from_totals", None)
        if self._kv_totals is not None and kv_bytes.swa and kv_bytes.window != memory.window_cap:
            self._kv_totals = None
        self.max_running = max_running
        self.prefill_budget = prefill_tokens_per_step
        self.reserve = reserve
        self.reserve_ratio = reserve[0]
        self.max_tokens = max_tokens
        self.check_every = check_every
        self.is_oracle = is_oracle
        self.progress = progress
        self.waiting: deque[Request] = deque()
        # Running requests in admission order, and the same split by phase
        # (each in running order): those decoding and those still prefilling.
        self.running: list[Request] = []
        self.decoding: list[Request] = []
        self.prefilling: list[Request] = []
        self._admissions = 0
        self._left = 0  # tokens the running requests have yet to produce, kept as they change
        self.recorder = Recorder(self.pool.bands, self.pool.sample_columns,
                                 token_entry_bytes=memory.token_entry_bytes,
                                 move_time_s=getattr(step_cost, "move_time_s", lambda moved: 0.0 * moved),
                                 is_oracle=is_oracle)
        self._band_counters = tuple(self.pool.counters.bands.values())
        self.arrived = self.done = self.steps = 0
        self.violations: list[str] = []
        self._wake: simpy.Event | None = None
        self._sample: tuple | None = None  # (epoch, pool sample) of the last row
        self._moved_mark = 0
        self._counts = dict(admitted=0, finished=0, retracted=0, rejected=0)

    # -- processes --

    def run(self) -> None:
        self.env.process(self._arrivals())
        self.env.process(self._scheduler())
        self.env.run()

    def _arrivals(self):
        for req in self.requests:
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self.arrived += 1
            if req.prompt_tokens + req.output_tokens > self.max_tokens:
                req.rejected = True
                self._counts["rejected"] += 1
                self._retire(req)
                continue
            self.waiting.append(req)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _scheduler(self):
        while True:
            if not self.running and not self.waiting:
                if self.arrived == len(self.requests):
                    return
                self._wake = self.env.event()
                yield self._wake
                continue
            event, step = self._launch_step()
            yield self.env.timeout(step[0])
            event.fire()
            self._end_step(*step)

    # -- one step --

    def _launch_step(self):
        """Allocate and launch one forward; returns its event and what
        `_end_step` needs once the step's time has passed."""
        # Bytes moved since the last step's accounting: moves made while
        # finishing requests after a forward are charged to the next step.
        moved0 = self._moved_mark
        # Running requests first: their decode token, then their next
        # prefill chunk; new requests only take what is left. A retraction
        # takes its victim out of `decoding`, which is then the decode batch.
        retracted = self._counts["retracted"]
        written = self._decode()
        prefill = self._continue_prefills()
        prefill_tokens = sum([c for _, c in prefill]) if prefill else 0
        admitted = self._admit(self.prefill_budget - prefill_tokens)
        if admitted:
            prefill += admitted
            prefill_tokens += sum([c for _, c in admitted])
        decode = list(self.decoding)
        if self._counts["retracted"] != retracted:  # decoders may have left since
            written = [r.last_loc(self.ps) for r in decode]
        batch = [r for r, _ in prefill] + decode if prefill else decode
        event = self.pool.backend.new_event(f"step {self.steps}")
        self._launch(event, prefill, written)
        self.pool.flush(urgent=False)  # opportunistic, while the forward runs
        moved = self._moved_bytes() - moved0
        self._moved_mark = moved0 + moved
        if self._kv_totals is not None and len(prefill) == len(self.prefilling):
            # every prefilling request is in the batch: it is all the running ones
            kv = self._kv_totals(len(batch), self.mem.held_seq, self.mem.held_window)
        else:
            kv = self.kv_bytes(batch)
        dt = self.step_cost(prefill_tokens, len(decode), kv, moved)
        return event, (dt, prefill, decode, prefill_tokens, moved)

    def _end_step(self, dt, prefill, decode, prefill_tokens, moved) -> None:
        """The forward is done: finish requests, ratchet, record the step."""
        self._complete(prefill, decode)
        self.steps += 1
        self.reserve_ratio = max(self.reserve[1], self.reserve_ratio - self.reserve[2])
        self._record(dt, prefill_tokens, len(decode), moved)
        if self.check_every and self.steps % self.check_every == 0:
            self._check()

    def _continue_prefills(self) -> list[tuple[Request, int]]:
        if not self.prefilling:
            return []
        out, budget = [], self.prefill_budget
        for r in list(self.prefilling):
            chunk = min(r.prefill_target - r.prefilled, budget)
            if chunk <= 0:
                break
            if r not in self.running:  # retracted while making room for an earlier one
                continue
            if self._alloc_or_retract(lambda r=r, c=chunk: self.mem.extend(r, c), keep=r):
                out.append((r, chunk))
                budget -= chunk
        return out

    def _admit(self, budget: int) -> list[tuple[Request, int]]:
        out = []
        if not self.waiting:
            return out
        now = self.env.now
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            r = self.waiting[0]
            left = self._left  # the running requests' tokens to produce (see _reserve_holds)
            if self.mem.cache is None and not self._room_for(
                    r.output_tokens - r.generated + r.context_tokens, 0, 0,
                    min(r.context_tokens, budget), left):
                # Without a cache there is no hit: the reserve is asked with
                # the numbers take_hit would set, and a refusal leaves the
                # request untouched (take_hit then _undo_admission would).
                break
            self.mem.take_hit(r, now)
            chunk = min(r.prefill_left, budget)
            # Ask, then act: the reserve is checked before the state slot and
            # the chunk are allocated (an allocation undone costs as much as
            # one kept, and its holes cost flushes). A state slot only takes
            # room from the tokens: check again once it is held.
            ok = self._reserve_holds(r, chunk, left)
            if ok and self.mem.state_band is not None:
                ok = self.mem.take_state(r) and self._reserve_holds(r, chunk, left)
            if not ok or not self._with_eviction(lambda: self.mem.extend(r, chunk)):  # noqa: B023 (called at once)
                self._undo_admission(r)
                break
            self.waiting.popleft()
            self._start(r)
            if r.admitted_s is None:
                r.admitted_s = now
                self._counts["admitted"] += 1
            out.append((r, chunk))
            budget -= chunk
        return out

    def _reserve_holds(self, new: Request, chunk: int, running_left: int) -> bool:
        """SGLang's admission guard: once `new`'s first `chunk` is allocated,
        room must remain for `reserve_ratio` of the tokens the running
        requests (`running_left`) and `new` have yet to produce. Room is the
        free pool room plus what evicting unlocked cached blocks would free
        (SGLang counts evictable cached tokens as available), less the
        chunk's new pages."""
        return self._room_for(_tokens_left(new), new.seq, len(new.pages), chunk, running_left)

    def _room_for(self, new_left: int, seq: int, held_pages: int, chunk: int,
                  running_left: int) -> bool:
        """`_reserve_holds` of a request with `new_left` tokens yet to
        produce, `seq` positions on `held_pages` pages, taking `chunk` more."""
        if self.reserve_ratio <= 0 or not self.running:
            return True
        need = self.reserve_ratio * (running_left + new_left)
        ps = self.ps
        chunk_slots = (-(-(seq + chunk) // ps) - held_pages) * ps
        other = self.mem.evictable_tokens() - chunk_slots
        # The live-count bound settles most refusals without the capacity search.
        if self.pool.available_size_bound() + other < need:
            return False
        return self.pool.available_size(schedulable=True) + other >= need

    def _undo_admission(self, r: Request) -> None:
        self.mem.retract(r, self.env.now)
        r.retractions -= 1  # an admission that did not happen is no retraction

    def _start(self, r: Request) -> None:
        """`r` joins the running requests, prefilling."""
        r.order = self._admissions
        self._admissions += 1
        self.running.append(r)
        self.prefilling.append(r)
        self._left += _tokens_left(r)

    def _stop(self, r: Request) -> None:
        """`r` leaves the running requests."""
        self.running.remove(r)
        (self.decoding if r in self.decoding else self.prefilling).remove(r)
        self._left -= _tokens_left(r)

    def _decode(self) -> list[int]:
        """One token for every decoding request (their ids); on a shortfall
        evict cached blocks, then retract the newest running request (it
        leaves `decoding` if it was there) and try again with the rest."""
        while self.decoding:
            written = self.mem.decode(self.decoding)
            if written is not None:
                return written
            if not self.mem.evict_some():
                self._retract(self.running[-1])  # decoders run: running is not empty
        return []

    def _with_eviction(self, attempt: Callable[[], bool]) -> bool:
        while not attempt():
            if not self.mem.evict_some():
                return False
        return True

    def _alloc_or_retract(self, attempt: Callable[[], bool], keep: Request) -> bool:
        """`attempt()` for `keep`; on shortfall evict cached blocks, then
        retract the newest running request (which may be `keep` itself: then
        False) and try again."""
        while not attempt():
            if self.mem.evict_some():
                continue
            victim = self.running[-1] if self.running else None
            if victim is None:
                return False
            self._retract(victim)
            if victim is keep:
                return False
        return True

    def _retract(self, r: Request) -> None:
        self._stop(r)
        self.mem.retract(r, self.env.now)
        self.waiting.appendleft(r)
        self._counts["retracted"] += 1
        self.reserve_ratio = self.reserve[0]

    def _launch(self, event, prefill, written: list[int]) -> None:
        """Declare the forward: its event, the token ids it writes (the
        decoders' `written`, then the prefill chunks' pages), the states."""
        ps = self.ps
        reps = written
        for r, chunk in prefill:
            first, last = (r.seq - chunk) // ps, (r.seq - 1) // ps
            reps.extend(p * ps for p in r.pages[first: last + 1])
        states = {}
        if self.mem.state_band is not None:
            states[self.mem.state_band] = [r.state for r in self.running]
        self.pool.set_inflight_forward(event, int64_ids(reps), states)

    def _complete(self, prefill, decode) -> None:
        now = self.env.now
        finished = []
        for r in decode:
            g = r.generated + 1
            r.generated = g
            if g >= r.output_tokens:
                finished.append(r)
        self._left -= len(decode)
        for r, chunk in prefill:
            r.prefilled += chunk
            self._left -= chunk
            if r.prefilled == r.prefill_target:  # decoding from the next step on
                if r.generated == 0:
                    r.generated = 1
                    self._left -= 1
                    r.first_token_s = now
                self.prefilling.remove(r)
                bisect.insort(self.decoding, r, key=_order)
                if r.generated >= r.output_tokens:
                    finished.append(r)
        if prefill and len(finished) > 1:
            finished.sort(key=_order)  # running order
        for r in finished:
            self._stop(r)
            self.mem.finish(r, now)
            r.finished_s = now
            self._counts["finished"] += 1
            self._retire(r)
        # Ratchet the requests whose positions moved (see Memory.ratchet);
        # those that finished or were retracted since hold no pages.
        mem = self.mem
        moved = [r for r in mem.window_due if r.pages] if mem.window_due else []
        mem.window_due = []
        if prefill:
            moved += [r for r, _ in prefill if r.pages]
        if moved:
            mem.ratchet(moved)

    def _retire(self, r: Request) -> None:
        self.recorder.request(r)
        self.done += 1
        if self.progress is not None:
            self.progress(self.done)

    # -- observation --

    def _moved_bytes(self) -> int:
        return sum([c.moved_bytes for c in self._band_counters])

    def _record(self, dt: float, prefill_tokens: int, decode_tokens: int, moved: int) -> None:
        """One step's raw counters, in `Recorder.raw_columns` order, and a
        pool sample (the recorder derives the pool columns, totals and
        ratios when the table is read)."""
        epoch = self.pool.epoch.value
        if self._sample is None or self._sample[0] != epoch:  # the pool changed since the last row
            self._sample = (epoch, self.pool.sample())
        mem = self.mem
        slots = mem.held_pages * self.ps  # the running requests' pages (Memory keeps the sums)
        counts = self._counts
        self.recorder.step((
            self.steps, self.env.now, dt, len(self.running), len(self.waiting), prefill_tokens,
            decode_tokens, counts["admitted"], counts["finished"], counts["retracted"],
            counts["rejected"], mem.evictions, mem.cache.pages if mem.cache else 0,
            slots - mem.held_seq, slots,
            sum([c.moves for c in self._band_counters]), moved,
        ), self._sample[1])

    def _check(self) -> None:
        problems = self.pool.verify() + self.mem.check(self.running)
        left = sum([_tokens_left(r) for r in self.running])
        if left != self._left:
            problems.append(f"tokens left to produce {self._left} != {left} recounted")
        if problems:
            self.violations.extend(f"step {self.steps}: {p}" for p in problems)


def _order(r: Request) -> int:
    return r.order


def _tokens_left(r: Request) -> int:
    """Tokens a request has yet to produce: its output left and its prefill left."""
    return r.output_tokens - r.generated + r.prefill_target - r.prefilled
