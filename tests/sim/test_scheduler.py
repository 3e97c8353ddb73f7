"""The scheduling policy driven by hand, with no SimPy: plan a step, then
complete it. Pools are tiny (100 B per token, page_size 1), so pages are
tokens and every number below is counted by hand."""

import subprocess
import sys

from unikv.sim.memory import Memory
from unikv.sim.request import Request
from unikv.sim.scheduler import Scheduler

from unikv import Band, Layout, UnifiedPool
from unikv.backends import SimBackend


def token_pool(pages=20, mode="eager"):
    layout = Layout(total_bytes=100 + 100 * pages, bands=[Band("full", entry_bytes=100, grow="down")])
    return UnifiedPool(layout, backend=SimBackend(), compaction=mode)


def state_pool():
    """mamba (400 B a slot) below full (100 B a token): 2000 usable bytes."""
    layout = Layout(total_bytes=400 + 2000, bands=[
        Band("mamba", entry_bytes=400, grow="up", unit="request"),
        Band("full", entry_bytes=100, grow="down")])
    return UnifiedPool(layout, backend=SimBackend(), compaction="eager")


def scheduler(pool, *, block=None, budget=100, max_running=16, reserve=(0.0, 0.0, 0.0)):
    mem = Memory(pool, window_tokens=None, block_tokens=block)
    return Scheduler(mem, max_running=max_running, prefill_tokens_per_step=budget,
                     max_tokens=10**6, reserve=reserve)


def step(sched, now):
    """Plan and complete one step at `now` (the forward takes no time)."""
    plan = sched.plan(now)
    sched.mem.begin_forward(sched.mem.new_event("t"), plan.write_ids, sched.running)
    finished = sched.complete(plan, now)
    assert sched.check() == []
    return plan, finished


def test_plan_admits_fcfs_into_the_chunk_budget_and_what_memory_holds():
    sched = scheduler(token_pool())
    reqs = [Request(i, 0.0, 8, 3) for i in range(3)]
    assert all(sched.arrive(r) for r in reqs)
    plan = sched.plan(0.0)
    # 8 + 8 pages of 20; r2's chunk (8) does not fit the 4 left: it waits, untouched.
    assert [(r.rid, c) for r, c in plan.prefill] == [(0, 8), (1, 8)] and plan.decode == []
    assert plan.prefill_tokens == 16 and len(plan.write_ids) == 16 and plan.whole_batch
    assert list(sched.waiting) == [reqs[2]] and reqs[2].pages == [] and reqs[2].retractions == 0
    sched.complete(plan, 1.0)
    assert [r.first_token_s for r in reqs[:2]] == [1.0, 1.0] and sched.decoding == reqs[:2]


def test_a_request_that_can_never_fit_is_rejected_on_arrival():
    sched = scheduler(token_pool())
    sched.max_tokens = 10
    assert not sched.arrive(Request(0, 0.0, 8, 3))
    assert sched.counts["rejected"] == 1 and not sched.waiting


def test_a_decode_shortfall_retracts_the_newest_running_request():
    # the reserve (0.1 x 36 = 3.6 tokens) lets both in, then decays to 0
    sched = scheduler(token_pool(), reserve=(0.1, 0.0, 0.05))
    r0, r1 = Request(0, 0.0, 8, 10), Request(1, 0.0, 8, 10)
    sched.arrive(r0), sched.arrive(r1)
    for t in range(3):  # prefill, then two decodes: 10 + 10 pages
        step(sched, float(t))
    assert sched.reserve_ratio == 0.0
    plan = sched.plan(3.0)  # 22 pages wanted: r1 goes back to the queue's head
    assert plan.decode == [r0] and list(plan.write_ids) == [r0.last_loc(1)]
    assert list(sched.waiting) == [r1] and r1.pages == [] and r1.retractions == 1
    assert sched.counts["retracted"] == 1 and sched.reserve_ratio == 0.1
    assert plan.prefill == []  # r1 needs 10 pages again; 9 are free


def test_a_decode_shortfall_evicts_cached_prefixes_before_retracting():
    sched = scheduler(token_pool(), block=4)
    cached, r1 = Request(0, 0.0, 8, 1, (1, 2)), Request(1, 1.0, 10, 10)
    sched.arrive(cached)
    step(sched, 0.0)  # done after its prefill: 8 pages cached
    sched.arrive(r1)
    for t in range(1, 4):  # 18, 19, 20 pages held
        step(sched, float(t))
    plan, _ = step(sched, 4.0)  # 21 wanted: the LRU block (4 pages) goes, nobody is retracted
    assert plan.decode == [r1] and sched.mem.evictions == 1 and sched.counts["retracted"] == 0


def test_a_prefill_chunk_that_retracts_its_own_request_is_not_planned():
    # One 30-token prompt in chunks of 8 on 20 pages: the third chunk does
    # not fit; the newest running request is the one being served, so it is
    # retracted and its chunk dropped; readmitted at once, its first chunk fits.
    sched = scheduler(token_pool(), budget=8)
    r = Request(0, 0.0, 30, 1)
    sched.arrive(r)
    step(sched, 0.0), step(sched, 1.0)
    assert r.seq == 16
    plan, _ = step(sched, 2.0)
    assert [(q.rid, c) for q, c in plan.prefill] == [(0, 8)] and r.retractions == 1
    assert r.seq == 8 and sched.counts["retracted"] == 1 and sched.counts["admitted"] == 1


def test_admission_never_pushes_running_requests_back():
    sched = scheduler(token_pool())
    r0, r1 = Request(0, 0.0, 16, 5), Request(1, 0.0, 8, 1)
    sched.arrive(r0)
    step(sched, 0.0)
    sched.arrive(r1)
    plan = sched.plan(1.0)  # 17 pages held after the decode: r1's 8 do not fit
    assert plan.prefill == [] and plan.decode == [r0] and sched.counts["retracted"] == 0
    assert list(sched.waiting) == [r1] and r1.retractions == 0 and r1.pages == []


def test_the_decode_reserve_holds_back_an_admission():
    # r0 (2 + 10 out) runs; r1 (2 + 10 out) would leave 20 - 2 - 2 = 16 free
    # tokens against 0.9 x (12 + 12) = 21.6 reserved: refused; with no
    # reserve both run.
    for reserve, admitted in (((0.9, 0.9, 0.0), [0]), ((0.0, 0.0, 0.0), [0, 1])):
        sched = scheduler(token_pool(), reserve=reserve)
        for i in range(2):
            sched.arrive(Request(i, 0.0, 2, 10))
        plan = sched.plan(0.0)
        assert [r.rid for r, _ in plan.prefill] == admitted


def test_a_state_slot_short_of_bytes_evicts_cached_prefixes():
    # r0 fills the buffer (a 400 B slot + 16 pages); at its finish the cache
    # keeps its 4 blocks and the last one's state snapshot. r1's slot needs
    # 400 B: the LRU leaf (4 pages and the snapshot) is evicted for it.
    sched = scheduler(state_pool(), block=4)
    r0, r1 = Request(0, 0.0, 16, 1, (1, 2, 3, 4)), Request(1, 1.0, 4, 1)
    sched.arrive(r0)
    step(sched, 0.0)
    assert sched.mem.cache.pages == 16 and sched.mem.cache.states == 1
    sched.arrive(r1)
    plan, _ = step(sched, 1.0)
    assert [q.rid for q, _ in plan.prefill] == [1] and sched.mem.evictions == 1


def test_the_scheduler_module_needs_no_simpy():
    code = "import sys, unikv.sim.scheduler, unikv.sim.executor; print('simpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_write_ids_are_the_decoders_newest_positions_then_one_id_per_chunk_page():
    import pytest
    from unikv.sim.scheduler import StepPlan

    layout = Layout(total_bytes=400 + 400 * 20, bands=[Band("full", entry_bytes=100, grow="down", page_size=4)])
    sched = scheduler(UnifiedPool(layout, backend=SimBackend(), compaction="eager"), budget=6)
    a, b, c = Request(0, 0.0, 5, 9), Request(1, 0.0, 4, 9), Request(2, 0.0, 9, 9)
    for r in (a, b, c):
        sched.arrive(r)
    step(sched, 0.0)  # a (5) and 1 token of b: b's prefill goes on next step
    step(sched, 1.0)
    plan = sched.plan(2.0)  # a decodes mid-page; b decodes into a fresh page; c's chunk spans pages
    assert plan.decode == [a, b] and plan.written is None and [r.rid for r, _ in plan.prefill] == [2]
    chunk = plan.prefill[0][1]
    chunk_pages = c.pages[(c.seq - chunk) // 4: (c.seq - 1) // 4 + 1]
    assert len(chunk_pages) > 1 and b.seq % 4 == 1 and a.seq % 4 != 1
    assert plan.write_ids.tolist() == [a.last_loc(4), b.last_loc(4)] + [p * 4 for p in chunk_pages]
    assert plan.write_pages == [t // 4 for t in plan.write_ids.tolist()]
    with pytest.raises(ValueError, match="page_size=0"):
        _ = StepPlan(0, [], [a], 0, None, True, [3]).write_ids
