"""A planned step as forward inputs: packed prefill steps, padded decode
steps, the paged-attention metadata and the slots the new K/V go to."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unikv.sim.memory import Memory  # noqa: E402
from unikv.sim.real.batch import BlockRows, build_batch  # noqa: E402
from unikv.sim.real.tokens import TokenSource  # noqa: E402
from unikv.sim.request import Request  # noqa: E402
from unikv.sim.scheduler import Scheduler, StepPlan  # noqa: E402

from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402

PS = 4


def setup(budget=12, window=None):
    bands = [Band("full", entry_bytes=64, grow="down", page_size=PS, blocks_per_page=2)]
    if window:
        bands.insert(0, Band("swa", entry_bytes=64, grow="up", page_size=PS, blocks_per_page=2))
    pool = UnifiedPool(Layout(total_bytes=64 * PS * 60, bands=bands), backend=SimBackend(), compaction="lazy")
    mem = Memory(pool, window_tokens=window, block_tokens=None)
    sched = Scheduler(mem, max_running=8, prefill_tokens_per_step=budget, max_tokens=10**6)
    return pool, sched


def positions_of(r, start, stop):
    return [r.pages[p // PS] * PS + p % PS for p in range(start, stop)]


def test_a_prefill_step_is_packed_and_its_metadata_matches_the_pool():
    pool, sched = setup()
    a, b = Request(0, 0.0, 7, 3), Request(1, 0.0, 9, 2)
    sched.arrive(a), sched.arrive(b)
    plan = sched.plan(0.0)  # a: 7, b: the first 5 of 9 (budget 12)
    src = TokenSource(vocab_size=50, block_tokens=None)
    batch = build_batch(plan, pool, src, {}, ["full"])
    assert batch.layout == "packed" and batch.input_ids.shape == (1, 12)
    assert batch.position_ids[0].tolist() == list(range(7)) + list(range(5))
    assert batch.input_ids[0].tolist() == src.prompt(a).tolist() + src.prompt(b)[:5].tolist()
    assert batch.cu_q.tolist() == [0, 7, 12] and batch.seq_lens.tolist() == [7, 5]
    assert batch.cu_q.dtype == torch.int32 and batch.block_tables["full"].dtype == torch.int32
    want = pool.translate(np.array(positions_of(a, 0, 7) + positions_of(b, 0, 5)), "full")
    assert batch.write_slots["full"].tolist() == want.tolist()
    table = batch.block_tables["full"]
    assert table.shape == (2, 2)
    for row, r in enumerate((a, b)):
        phys = pool.translate(np.array(r.pages) * PS, "full") // PS
        assert table[row, :len(r.pages)].tolist() == phys.tolist()
    # a completes its prompt (samples at its last row); b's chunk does not
    assert batch.sample_rows.tolist() == [6] and batch.samplers == (a,)


def test_a_decode_only_step_is_padded_and_feeds_the_newest_generated_token():
    pool, sched = setup()
    a, b = Request(0, 0.0, 5, 4), Request(1, 0.0, 3, 4)
    sched.arrive(a), sched.arrive(b)
    sched.complete(sched.plan(0.0), 0.0)
    plan = sched.plan(1.0)
    assert plan.prefill == [] and plan.decode == [a, b]
    batch = build_batch(plan, pool, TokenSource(vocab_size=50, block_tokens=None), {0: [17], 1: [23]},
                        ["full"])
    assert batch.layout == "padded" and batch.input_ids.tolist() == [[17], [23]]
    assert batch.position_ids.tolist() == [[5], [3]] and batch.seq_lens.tolist() == [6, 4]
    assert batch.cu_q.tolist() == [0, 1, 2] and batch.sample_rows.tolist() == [0, 1]
    want = pool.translate(np.array(positions_of(a, 5, 6) + positions_of(b, 3, 4)), "full")
    assert batch.write_slots["full"].tolist() == want.tolist()


def test_a_readmitted_request_recomputes_prompt_and_generated_without_sampling():
    pool, sched = setup(budget=32)
    r = Request(0, 0.0, 6, 5)
    sched.arrive(r)
    sched.complete(sched.plan(0.0), 0.0)
    sched.complete(sched.plan(1.0), 1.0)  # generated 2
    sched._retract_newest(2.0)
    plan = sched.plan(3.0)
    assert plan.prefill == [(r, 7)]  # prompt + the first generated token
    src = TokenSource(vocab_size=50, block_tokens=None)
    batch = build_batch(plan, pool, src, {0: [31, 32]}, ["full"])
    assert batch.input_ids[0].tolist() == src.prompt(r).tolist() + [31]
    assert batch.samplers == () and batch.sample_rows.numel() == 0


def test_window_pages_released_read_the_sink_in_the_window_band_table():
    pool, sched = setup(budget=16, window=4)
    r = Request(0, 0.0, 14, 2)
    sched.arrive(r)
    sched.complete(sched.plan(0.0), 0.0)  # the ratchet releases pages out of the window on swa
    plan = sched.plan(1.0)
    batch = build_batch(plan, pool, TokenSource(vocab_size=50, block_tokens=None), {0: [1]}, ["swa", "full"])
    swa, full = batch.block_tables["swa"][0].tolist(), batch.block_tables["full"][0].tolist()
    assert swa[:2] == [0, 0] and all(p > 0 for p in swa[2:]) and all(p > 0 for p in full)


def test_an_empty_plan_is_refused():
    pool, _ = setup()
    with pytest.raises(ValueError, match="plans no request"):
        build_batch(StepPlan(3, [], [], 0, np.empty(0, np.int64), True), pool,
                    TokenSource(vocab_size=5, block_tokens=None), {}, ["full"])


def same_tables(plan, pool, bands, rows):
    """The device path (`rows` kept across steps) against the readable one."""
    src = TokenSource(vocab_size=50, block_tokens=None)
    generated = {r.rid: [1] * 64 for r in plan.decode + [r for r, _ in plan.prefill]}
    fast = build_batch(plan, pool, src, generated, bands, block_rows=rows)
    ref = build_batch(plan, pool, src, generated, bands, readable=True)
    assert ref.page_rows is None and fast.page_rows is not None
    for band in bands:
        assert torch.equal(fast.block_tables[band], ref.block_tables[band]), (plan.index, band)
        assert torch.equal(fast.write_slots[band], ref.write_slots[band]), (plan.index, band)
    return fast


def test_window_pages_the_pool_took_back_read_the_sink_in_the_kept_rows():
    """A window-only pool: released pages' ids go back to the pool (GONE in
    `Request.pages`) and are handed to other requests; the kept rows must
    read 0 there, not the new owner's page."""
    bands = [Band("swa", entry_bytes=64, grow="up", page_size=PS, blocks_per_page=2)]
    pool = UnifiedPool(Layout(total_bytes=64 * PS * 14, bands=bands), backend=SimBackend(), compaction="lazy")
    mem = Memory(pool, window_tokens=4, block_tokens=None)
    assert mem.release_drops
    sched = Scheduler(mem, max_running=4, prefill_tokens_per_step=16, max_tokens=10**6)
    rows = BlockRows(pool, ["swa"])
    for i in range(4):
        sched.arrive(Request(i, 0.0, 9 + 3 * i, 12))
    gone = steps = 0
    for step in range(40):
        plan = sched.plan(float(step))
        if not plan.prefill and not plan.decode:
            break
        batch = same_tables(plan, pool, ["swa"], rows)
        gone += sum(p == 0 for r in batch.requests for p in r.pages)
        sched.complete(plan, float(step))
        steps += 1
    assert steps > 10 and gone > 0


def test_rows_of_finished_and_retracted_requests_are_closed_and_readmissions_get_fresh_rows():
    pool, sched = setup(budget=32)
    rows = BlockRows(pool, ["full"])
    a, b = Request(0, 0.0, 6, 2), Request(1, 0.0, 5, 8)
    sched.arrive(a), sched.arrive(b)
    t = 0
    while a.finished_s is None:  # a finishes after its second token
        plan = sched.plan(float(t))
        same_tables(plan, pool, ["full"], rows)
        sched.complete(plan, float(t))
        t += 1
    assert rows.open_rows() == 2  # a's row closes at the next step
    plan = sched.plan(float(t))
    same_tables(plan, pool, ["full"], rows)
    sched.complete(plan, float(t))
    assert rows.open_rows() == 1
    first = rows.rows_of([b])[0]
    sched._retract_newest(t + 1.0)
    plan = sched.plan(t + 2.0)  # b readmitted: a new page list, its row rewritten
    same_tables(plan, pool, ["full"], rows)
    row = rows.rows_of([b])[0]  # the closed row, zeroed and handed out again
    width = rows.rows.width
    want = b.pages + [0] * (width - len(b.pages))
    assert rows.open_rows() == 1 and row == first and rows.rows.gather([row], width)[0].tolist() == want


def test_a_fresh_default_rows_table_builds_the_same_batch():
    """Without the run's `BlockRows`, build_batch writes every page into a
    fresh one: the same tables as the kept rows, which ship only new pages."""
    pool, sched = setup()
    sched.arrive(Request(0, 0.0, 7, 3)), sched.arrive(Request(1, 0.0, 9, 2))
    plan = sched.plan(0.0)
    src = TokenSource(vocab_size=50, block_tokens=None)
    kept = BlockRows(pool, ["full"])
    fast = build_batch(plan, pool, src, {}, ["full"], block_rows=kept)
    fresh = build_batch(plan, pool, src, {}, ["full"])
    assert torch.equal(fast.block_tables["full"], fresh.block_tables["full"])
    assert torch.equal(fast.write_slots["full"], fresh.write_slots["full"])
