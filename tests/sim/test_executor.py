"""The cost-model executor: the step's KV read, its time, its event."""

import numpy as np
from unikv.sim.executor import CostModelExecutor
from unikv.sim.memory import Memory
from unikv.sim.request import Request
from unikv.sim.scheduler import StepPlan

from unikv import Band, Layout, UnifiedPool
from unikv.backends import SimBackend


class Reader:
    """A KV reader with `from_totals`, logging which way it was asked."""

    swa, window = 0, 0

    def __init__(self):
        self.asked = []

    def __call__(self, batch):
        self.asked.append(("walk", [r.rid for r in batch]))
        return 7

    def from_totals(self, requests, seq_total, window_total):
        self.asked.append(("totals", requests, seq_total))
        return 9


def setup():
    pool = UnifiedPool(Layout(total_bytes=100 * 21, bands=[Band("full", entry_bytes=100, grow="down")]),
                       backend=SimBackend())
    mem = Memory(pool, window_tokens=None, block_tokens=None)
    reader, costs = Reader(), []
    ex = CostModelExecutor(mem, lambda *a: costs.append(a) or 0.5, reader)
    return mem, ex, reader, costs


def plan(whole, prefill, decode):
    return StepPlan(3, prefill, decode, sum(c for _, c in prefill), np.zeros(0, np.int64), whole)


def test_the_whole_running_set_reads_from_the_memory_totals():
    mem, ex, reader, costs = setup()
    a, b = Request(0, 0.0, 4, 2), Request(1, 0.0, 4, 2)
    mem.take_hit(a, 0.0)
    mem.extend(a, 4)
    assert ex.duration_s(plan(True, [(a, 4)], [b]), 300) == 0.5
    assert reader.asked == [("totals", 2, 4)] and costs == [(4, 1, 9, 300)]
    ex.duration_s(plan(False, [(a, 4)], [b]), 0)
    assert reader.asked[-1] == ("walk", [0, 1]) and costs[-1] == (4, 1, 7, 0)


def test_launch_gives_the_steps_event_and_done_fires_it():
    _, ex, _, _ = setup()
    event = ex.launch(plan(True, [], []))
    assert event.label == "step 3" and not event.query()
    ex.done(event)
    assert event.query()


def test_moves_cost_what_the_cost_model_says_and_nothing_without_a_move_term():
    mem, ex, _, _ = setup()
    assert ex.move_time_s(np.array([10, 0])).tolist() == [0.0, 0.0]

    def cost(*_):
        return 1.0

    cost.move_time_s = lambda moved: moved * 1e-3
    assert CostModelExecutor(mem, cost, Reader()).move_time_s(2000) == 2.0


def test_a_decode_only_whole_batch_is_costed_from_the_totals_as_its_shape_is():
    from unikv.sim.cost import EngineStepCost, HardwareSpec
    from unikv.sim.models import load_model
    from unikv.sim.run import KVRead

    model = load_model("llama-3.1-8b")
    mem, _, _, _ = setup()
    a, b = Request(0, 0.0, 4, 9), Request(1, 0.0, 6, 9)
    for r, n in ((a, 4), (b, 6)):
        mem.take_hit(r, 0.0)
        mem.extend(r, n)
    shaped = []

    class Shaped(EngineStepCost):  # the plain path: the shape built and passed
        def __call__(self, *args):
            shaped.append(args)
            return super().__call__(*args)

    cost = Shaped(model, HardwareSpec.h200())
    ex = CostModelExecutor(mem, cost, KVRead(model))
    whole = ex.duration_s(plan(True, [], [a, b]), 4096)
    assert not shaped  # the decode path took it
    partial = ex.duration_s(plan(False, [], [a, b]), 4096)  # the same batch, walked
    assert shaped and whole == partial
    ex._decode_s = None
    assert ex.duration_s(plan(True, [], [a, b]), 4096) == whole
