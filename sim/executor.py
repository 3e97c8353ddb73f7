"""Executors: what runs a planned step, and how long it takes.

The driver (`sim.engine`) calls, per step, in this order:

1. `launch(plan)`: start the step's forward; returns its done event (the
   pool's backend event the hazards wait on);
2. the driver declares the forward to the memory layer and flushes
   opportunistically while it runs;
3. `duration_s(plan, moved_bytes)`: the step's seconds (the clock advances
   by them);
4. `done(event)`, once the clock has advanced: the forward has finished.

`CostModelExecutor` runs nothing: the step's time comes from a cost model.
A real executor would enqueue the batch's forward in `launch` (the event
recorded after it), wait for it in `duration_s` and return the measured
time, and have nothing to do in `done` (its event fires on the device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from unikv.sim.memory import Memory
from unikv.sim.request import Request
from unikv.sim.scheduler import StepPlan


class Executor(Protocol):
    """Runs (or costs) the steps a `Scheduler` plans."""

    def launch(self, plan: StepPlan) -> Any:
        """Start `plan`'s forward; returns its done event."""

    def duration_s(self, plan: StepPlan, moved_bytes: int) -> float:
        """Seconds the step takes, its page moves (`moved_bytes`) included."""

    def done(self, event: Any) -> None:
        """The step's time has passed: its forward is finished."""


class CostModelExecutor:
    """Step times from a cost model; the forward's event is fired by hand.

    Args:
        memory: the memory layer the steps allocate from (its backend makes
            the events; its totals feed `kv_bytes.from_totals`).
        step_cost: (prefill_tokens, decode_tokens, kv_bytes_read, moved_bytes)
            -> seconds of one engine step; one with a `shape_of(plan, memory)`
            method (`sim.cost.EngineStepCost`) also gets that as a fifth
            argument (the step's chunks and contexts, for attention FLOPs);
            one with `decode_s` and `window_tokens` (`EngineStepCost`,
            `sim.profile.ProfileStepCost`) costs a step where every running
            request decodes from the memory's totals, with no shape built
            (and no KV bytes counted where `reads_kv_bytes` is False).
        kv_bytes: batch -> KV bytes its attention reads per step (with
            `from_totals`, as `sim.run.KVRead`, read from the running
            requests' totals when the batch is all of them).
    """

    def __init__(self, memory: Memory, step_cost: Callable, kv_bytes: Callable[[list[Request]], int]) -> None:
        self.mem = memory
        self.step_cost = step_cost
        self.kv_bytes = kv_bytes
        # A reader that takes totals (sim.run.KVRead) over the same window as
        # the memory layer: a batch of every running request reads from the
        # totals Memory keeps instead of a walk.
        self._kv_totals = getattr(kv_bytes, "from_totals", None)
        if self._kv_totals is not None and kv_bytes.swa and kv_bytes.window != memory.window_cap:
            self._kv_totals = None
        # moved bytes (an int or an array) -> seconds the cost model charges
        self.move_time_s = getattr(step_cost, "move_time_s", _no_move_time)
        # a cost model that charges attention by context (sim.cost) takes the step's shape
        self._shape_of = getattr(step_cost, "shape_of", None)
        # ... and may cost a step that only decodes, the whole batch, from the
        # memory's totals with no shape built (`decode_s`), when its window is
        # the memory's (as `sim.roofline.shape_of` reads the totals)
        window = getattr(step_cost, "window_tokens", None)
        self._decode_s = getattr(step_cost, "decode_s", None) \
            if self._kv_totals is not None and window in (None, memory.window_cap) else None
        self._shape_window = window is not None  # without window layers a shape sums no window
        # a cost model that says it never reads the KV bytes (a profile) is not handed them
        self._reads_kv = getattr(step_cost, "reads_kv_bytes", True)

    def launch(self, plan: StepPlan) -> Any:
        return self.mem.new_event(f"step {plan.index}")

    def duration_s(self, plan: StepPlan, moved_bytes: int) -> float:
        decoders = len(plan.decode)
        if not plan.prefill and plan.whole_batch and self._decode_s is not None:
            mem = self.mem  # the usual step: every running request decodes
            seq, inside = mem.held_seq, mem.held_window
            kv = self._kv_totals(decoders, seq, inside) if self._reads_kv else 0
            return self._decode_s(decoders, seq, inside if self._shape_window else 0, kv, moved_bytes)
        if self._kv_totals is not None and plan.whole_batch:
            kv = self._kv_totals(len(plan.prefill) + decoders, self.mem.held_seq, self.mem.held_window)
        else:
            kv = self.kv_bytes(plan.batch())
        if self._shape_of is not None:
            return self.step_cost(plan.prefill_tokens, decoders, kv, moved_bytes, self._shape_of(plan, self.mem))
        return self.step_cost(plan.prefill_tokens, decoders, kv, moved_bytes)

    def done(self, event: Any) -> None:
        event.fire()


def _no_move_time(moved_bytes):
    """A cost model without a move term charges nothing for moves."""
    return 0.0 * moved_bytes
