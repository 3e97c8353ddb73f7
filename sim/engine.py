"""The SimPy layer: an arrival process and a step loop around a `Scheduler`.

The policy lives in `sim.scheduler` and the step's time in an executor
(`sim.executor`); this module only drives them on a SimPy clock and records
what happened. One loop iteration is one engine step: the scheduler plans it
(allocating its memory), the executor launches it, the memory layer declares
the forward and flushes opportunistically while it runs, the clock advances
by the executor's duration, then the scheduler completes the step and the
step is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from unikv.sim.executor import CostModelExecutor, Executor
from unikv.sim.memory import Memory
from unikv.sim.recorder import Recorder
from unikv.sim.request import Request
from unikv.sim.scheduler import Scheduler


class Clock(simpy.Environment):
    """SimPy's environment, whose clock the step loop may move by itself.

    A step that ends before any scheduled event (the next arrival, a wake)
    needs no event of its own: the loop advances the clock to the step's end
    as a timeout would (the same sum, so the same float) and goes on, where
    a timeout would cost an event, a heap push and pop and a resume of the
    generator per step. Any other step yields a timeout as before, so events
    at the same instant keep SimPy's order."""

    def advance(self, delay: float) -> bool:
        """Move the clock `delay` seconds on when no scheduled event falls at
        or before the new time; False (nothing changed) otherwise, or for a
        negative delay (a timeout then refuses it)."""
        at = self._now + delay  # what Environment.schedule computes for a timeout
        if not delay >= 0 or (self._queue and self._queue[0][0] <= at):
            return False
        self._now = at
        return True


class Simulation:
    """All state of one run; processes are methods of this object.

    Args:
        requests: trace requests sorted by arrival.
        memory: the request-level memory layer (owns the pool).
        step_cost: (prefill_tokens, decode_tokens, kv_bytes_read, moved_bytes)
            -> seconds of one engine step (`CostModelExecutor`).
        kv_bytes: batch -> KV bytes its attention reads per step (see
            `CostModelExecutor`).
        max_running, prefill_tokens_per_step, max_tokens, reserve: the
            scheduler's knobs (see `Scheduler`).
        check_every: run the accounting checks every N steps (0 = never).
        is_oracle: the unusable-free ratio is 0 by definition.
        progress: called with the number of finished requests, or None.
        executor: runs the steps instead of the cost model (None: a
            `CostModelExecutor` over `step_cost` and `kv_bytes`).
    """

    def __init__(self, requests: list[Request], memory: Memory, *, step_cost: Callable,
                 kv_bytes: Callable[[list[Request]], int], max_running: int,
                 prefill_tokens_per_step: int, max_tokens: int,
                 reserve: tuple[float, float, float] = (0.0, 0.0, 0.0), check_every: int = 0,
                 is_oracle: bool = False, progress: Callable[[int], None] | None = None,
                 executor: Executor | None = None) -> None:
        self.env = Clock()
        self.requests = requests
        self.mem = memory
        self.scheduler = Scheduler(memory, max_running=max_running,
                                   prefill_tokens_per_step=prefill_tokens_per_step,
                                   max_tokens=max_tokens, reserve=reserve)
        cost = CostModelExecutor(memory, step_cost, kv_bytes)
        self.executor = executor if executor is not None else cost
        self.check_every = check_every
        self.progress = progress
        self.recorder = Recorder(memory.band_names, memory.sample_columns,
                                 token_entry_bytes=memory.token_entry_bytes,
                                 move_time_s=cost.move_time_s, is_oracle=is_oracle)
        self.arrived = self.done = 0
        self.violations: list[str] = []
        self._wake: simpy.Event | None = None

    # -- processes --

    def run(self) -> None:
        self.env.process(self._arrivals())
        self.env.process(self._step_loop())
        self.env.run()

    def _arrivals(self):
        for req in self.requests:
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self.arrived += 1
            if not self.scheduler.arrive(req):
                self._retire(req)
                continue
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    def _step_loop(self):
        sched, mem, executor, env = self.scheduler, self.mem, self.executor, self.env
        while True:
            if not sched.running and not sched.waiting:
                if self.arrived == len(self.requests):
                    return
                self._wake = env.event()
                yield self._wake
                continue
            plan = sched.plan(env.now)
            event = executor.launch(plan)
            pages = plan.write_pages  # when known, the ids' array is never built
            moved = mem.begin_forward(event, plan.write_ids if pages is None else None, sched.running, pages)
            dt = executor.duration_s(plan, moved)
            if not env.advance(dt):  # an event falls inside the step: SimPy orders them
                yield env.timeout(dt)
            executor.done(event)
            now = env.now
            for r in sched.complete(plan, now):
                self._retire(r)
            self._record(now, dt, plan.prefill_tokens, len(plan.decode), moved)
            if self.check_every and sched.steps % self.check_every == 0:
                self._check()

    def _retire(self, r: Request) -> None:
        self.recorder.request(r)
        self.done += 1
        if self.progress is not None:
            self.progress(self.done)

    # -- observation --

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    def _record(self, now: float, dt: float, prefill_tokens: int, decode_tokens: int, moved: int) -> None:
        """One step's raw counters, in `Recorder.raw_columns` order, and a
        pool sample (the recorder derives the pool columns, totals and
        ratios when the table is read)."""
        mem, sched = self.mem, self.scheduler
        slots = mem.held_pages * mem.ps  # the running requests' pages (Memory keeps the sums)
        counts = sched.counts
        self.recorder.step((
            sched.steps, now, dt, len(sched.running), len(sched.waiting), prefill_tokens,
            decode_tokens, counts["admitted"], counts["finished"], counts["retracted"],
            counts["rejected"], mem.evictions, mem.cache.pages if mem.cache else 0,
            slots - mem.held_seq, slots, mem.moves(), moved,
        ), mem.sample())

    def _check(self) -> None:
        problems = self.scheduler.check()
        if problems:
            self.violations.extend(f"step {self.steps}: {p}" for p in problems)
