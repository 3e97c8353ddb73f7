"""The engine on tiny hand-made traces with hand-computed outcomes.

Pool: one full band, 100 B/token, page_size 1, 20 usable pages; every step
takes 1 s (constant cost), so times are step counts.
"""

import pytest
from unikv.sim.config import RunConfig
from unikv.sim.engine import Simulation
from unikv.sim.layouts import applicable_kinds
from unikv.sim.memory import Memory
from unikv.sim.models import list_models, load_model
from unikv.sim.request import Request
from unikv.sim.run import run

from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend


def const_cost(*_):
    return 1.0


def small_pool(pages=20, mode="lazy", page_size=1, bands=("full",), window=None):
    specs = [Band("full", entry_bytes=100, grow="down", page_size=page_size)]
    if "swa" in bands:
        specs.insert(0, Band("swa", entry_bytes=100, grow="up", page_size=page_size))
    sink = 100 * page_size
    layout = Layout(total_bytes=sink + 100 * page_size * pages * len(specs), bands=specs)
    return UnifiedPool(layout, backend=SimBackend(materialize=True), compaction=mode)


def simulate(pool, reqs, *, window=None, block=None, max_tokens=10**9, **kw):
    mem = Memory(pool, window_tokens=window, block_tokens=block)
    sim = Simulation(reqs, mem, step_cost=const_cost, kv_bytes=lambda b: 0, max_running=kw.pop("max_running", 16),
                     prefill_tokens_per_step=kw.pop("budget", 100), max_tokens=max_tokens, check_every=1, **kw)
    sim.run()
    assert sim.violations == []
    return sim, sim.recorder.requests_frame()


def record_evictions(mem, entry) -> list:
    """Spy on the cache's LRU eviction: the list it appends `entry(node)` to."""
    evicted = []
    evict_one = mem.cache.evict_one

    def spy():
        node = evict_one()
        if node is not None:
            evicted.append(entry(node))
        return node

    mem.cache.evict_one = spy
    return evicted


def test_fcfs_admission_waits_for_memory():
    reqs = [Request(i, t, 8, 3) for i, t in enumerate((0.0, 0.1, 0.2))]
    pool = small_pool()
    sim, df = simulate(pool, reqs)
    # r0 admitted at 0; r1 at 1 (r0 holds 8); r2 needs 8 but only 3 free
    # until r0 finishes at 3 (prefill + 2 decodes), then runs 3..6.
    assert df["admitted_s"].tolist() == [0.0, 1.0, 3.0]
    assert df["first_token_s"].tolist() == [1.0, 2.0, 4.0]
    assert df["finished_s"].tolist() == [3.0, 4.0, 6.0]
    assert df["ttft_s"].round(6).tolist() == [1.0, 1.9, 3.8]
    assert df["tpot_s"].tolist() == [1.0, 1.0, 1.0]
    assert df["retractions"].sum() == 0
    pool.flush()
    assert pool.available_size() == 20  # everything returned


def test_max_running_caps_admission():
    reqs = [Request(i, 0.0, 2, 2) for i in range(3)]
    _, df = simulate(small_pool(), reqs, max_running=2)
    assert df["admitted_s"].tolist() == [0.0, 0.0, 2.0]


def test_chunked_prefill_spreads_a_long_prompt():
    reqs = [Request(0, 0.0, 10, 2)]
    _, df = simulate(small_pool(), reqs, budget=4)
    # chunks 4, 4, 2 at t=0,1,2 -> first token at 3, one decode -> 4
    assert df["first_token_s"].tolist() == [3.0] and df["finished_s"].tolist() == [4.0]


def test_retraction_pushes_back_the_newest_request():
    reqs = [Request(0, 0.0, 8, 10), Request(1, 0.5, 8, 10)]
    sim, df = simulate(small_pool(), reqs)
    # t=3: both decode (r0 seq 11, r1 seq 10 = 21 > 20) -> r1 is retracted,
    # keeping its 2 tokens; it re-enters only once memory allows.
    assert df.loc[1, "retractions"] >= 1 and df.loc[0, "retractions"] == 0
    assert df["finished_s"].notna().all()
    assert df.loc[0, "finished_s"] == 10.0
    assert df.loc[1, "first_token_s"] == 2.0  # kept across the retraction


def test_rejects_requests_that_can_never_fit():
    reqs = [Request(0, 0.0, 8, 3), Request(1, 0.0, 30, 3)]
    sim, df = simulate(small_pool(), reqs, max_tokens=20)
    assert df["rejected"].tolist() == [False, True]
    assert df.loc[1, "admitted_s"] is None or df["admitted_s"].isna()[1]


def test_window_ratchet_releases_exactly_the_out_of_window_pages():
    pool = small_pool(page_size=2, bands=("swa", "full"))
    reqs = [Request(0, 0.0, 6, 6)]
    mem = Memory(pool, window_tokens=4, block_tokens=None)
    sim = Simulation(reqs, mem, step_cost=const_cost, kv_bytes=lambda b: 0, max_running=4,
                     prefill_tokens_per_step=100, max_tokens=100, check_every=1)
    seen = []
    orig = pool.release_pages  # the memory layer releases whole pages

    def spy(pages, band):
        seen.append((sim.env.now, sorted(set(pages))))
        return orig(pages, band)

    pool.release_pages = spy
    sim.run()
    # pages of 2 tokens; after the prefill (seq 6) pages 0 ([0,2)) is out of
    # the 4-token window; each later page leaves when seq passes 2 more.
    released_steps = [t for t, _ in seen]
    assert released_steps == [1.0, 3.0, 5.0]
    assert all(len(p) == 1 for _, p in seen)
    assert sim.violations == []


def test_oracle_admits_at_least_as_much_as_a_static_layout():
    from unikv import StaticPartitionPool

    layout = Layout(total_bytes=100 * 41, bands=[
        Band("swa", entry_bytes=100, grow="up"), Band("full", entry_bytes=100, grow="down")])
    reqs = [Request(i, i * 0.3, 6, 4) for i in range(12)]
    runs = {}
    for name, pool in (("oracle", OraclePool(layout)),
                       ("static", StaticPartitionPool(layout, fractions={"swa": 0.2, "full": 0.8})),
                       ("unified", UnifiedPool(layout))):
        reqs = [Request(i, i * 0.3, 6, 4) for i in range(12)]
        sim, df = simulate(pool, reqs, window=2)
        runs[name] = df
    assert runs["oracle"]["finished_s"].max() <= runs["static"]["finished_s"].max()
    assert runs["oracle"]["finished_s"].max() <= runs["unified"]["finished_s"].max()


def test_prefix_hits_reuse_cached_blocks_and_lru_evicts_leaves_first():
    pool = small_pool()
    reqs = [Request(0, 0.0, 8, 1, (1, 2)), Request(1, 1.5, 8, 1, (1, 5)),
            Request(2, 3.0, 16, 1, (7, 8, 9, 10))]
    mem = Memory(pool, window_tokens=None, block_tokens=4)
    evicted = record_evictions(mem, lambda node: node.key)
    sim = Simulation(reqs, mem, step_cost=const_cost, kv_bytes=lambda b: 0, max_running=4,
                     prefill_tokens_per_step=100, max_tokens=100, check_every=1)
    sim.run()
    df = sim.recorder.requests_frame()
    # B shares block 1 with A (its second block differs): 4 tokens hit;
    # C needs 16 pages with 8 free: LRU leaves go first, A's block 2 then B's 5.
    assert df["hit_tokens"].tolist() == [0, 4, 0]
    assert evicted == [2, 5]
    assert sim.violations == []
    assert mem.cache.pages == 4 + 16


def test_a_prompt_fully_cached_still_computes_its_last_token():
    pool = small_pool()
    reqs = [Request(0, 0.0, 8, 1, (1, 2)), Request(1, 2.0, 8, 1, (1, 2))]
    sim, df = simulate(pool, reqs, block=4)
    assert df["hit_tokens"].tolist() == [0, 4]  # block 2 is recomputed


def test_window_model_hit_needs_the_window_still_bound():
    # A finishes right after its prefill: its whole prompt is still bound on
    # swa, so B (same 3 blocks, one more token) resumes at 12 tokens.
    pool = small_pool(page_size=1, bands=("swa", "full"))
    reqs = [Request(0, 0.0, 12, 1, (1, 2, 3)), Request(1, 10.0, 13, 1, (1, 2, 3))]
    _, df = simulate(pool, reqs, window=4, block=4)
    assert df["hit_tokens"].tolist() == [0, 12]
    # A decodes 5 tokens: its ratchet releases swa pages up to position 13,
    # so no block boundary keeps its preceding 4-token window: no hit.
    pool = small_pool(page_size=1, bands=("swa", "full"))
    reqs = [Request(0, 0.0, 12, 6, (1, 2, 3)), Request(1, 10.0, 13, 1, (1, 2, 3))]
    _, df = simulate(pool, reqs, window=4, block=4)
    assert df["hit_tokens"].tolist() == [0, 0]


def test_admission_reserve_counts_evictable_cached_blocks():
    # A (12 tokens, 3 blocks of 4) finishes at t=1: 12 cached pages, 8 free.
    # B (2 + 10 out) and C (2 + 3 out) arrive at 1.5; the reserve ratio is 0.9.
    # B is admitted alone. C: after its chunk 20 - 12 - 2 - 2 = 4 pages are
    # free, but room must remain for 0.9 x (B: 10 + 2, C: 3 + 2) = 15.3
    # tokens: free room alone stalls C until B finishes; with the 12
    # evictable cached pages, 16 >= 15.3 and C runs beside B.
    # B and C prefill (1.5 -> 2.5), decode twice (C done at 4.5, its 4 pages
    # freed); B holds 11 tokens at the end, 3 more than the 8 uncached
    # pages: at 8.5 its decode evicts the LRU leaf, A's block 3. (Eager
    # compaction: a lazy pool keeps moved-out pages pending a step longer.)
    pool = small_pool(mode="eager")
    reqs = [Request(0, 0.0, 12, 1, (1, 2, 3)), Request(1, 1.5, 2, 10), Request(2, 1.5, 2, 3)]
    mem = Memory(pool, window_tokens=None, block_tokens=4)
    evicted = record_evictions(mem, lambda node: (sim.env.now, node.key))
    sim = Simulation(reqs, mem, step_cost=const_cost, kv_bytes=lambda b: 0, max_running=4,
                     prefill_tokens_per_step=100, max_tokens=100, reserve=(0.9, 0.9, 0.0),
                     check_every=1)
    sim.run()
    df = sim.recorder.requests_frame()
    assert sim.violations == []
    assert df["admitted_s"].tolist() == [0.0, 1.5, 1.5]
    assert df["finished_s"].tolist() == [1.0, 11.5, 4.5]
    assert evicted == [(8.5, 3)]
    assert df["retractions"].sum() == 0
    assert mem.cache.pages == 8 and mem.cache.evictable_bytes == 8 * 100
    assert mem.evictable_tokens() == 8


def test_evictable_bytes_follow_locks_and_the_window_ratchet():
    # Window 4, pages of 2 tokens on swa + full: A (12 tokens, 3 blocks of 4,
    # 8 out) releases swa pages as it decodes; at its finish only the pages
    # still inside its window hold swa bytes, and the node bytes say so.
    pool = small_pool(page_size=2, bands=("swa", "full"))
    reqs = [Request(0, 0.0, 12, 8, (1, 2, 3)), Request(1, 20.0, 9, 1, (1, 2))]
    sim, _ = simulate(pool, reqs, window=4, block=4)  # check_every=1 checks node bytes
    cache = sim.mem.cache
    by_key = {n.key: n.nbytes for n in cache.walk()}
    page = 2 * 100
    # A's seq at its finish: 12 + 7 = 19 -> swa pages of positions < 14 released.
    assert by_key == {1: 2 * page, 2: 2 * page, 3: 2 * page}
    assert cache.evictable_bytes == 6 * page and sim.mem.evictable_tokens() == 6


def test_the_engine_layers_reach_the_pool_only_through_memory():
    import inspect
    import re

    from unikv.sim import engine, executor, scheduler, shortfall

    for module in (engine, scheduler, executor, shortfall):
        assert not re.search(r"\.pool\b", inspect.getsource(module)), module.__name__


def window_only_pool(kind, pages=12):
    """One window band of page_size 2 (an all-sliding-window model)."""
    band = Band("swa", entry_bytes=100, grow="down", page_size=2)
    layout = Layout(total_bytes=200 + 200 * pages, bands=[band])
    if kind == "static":
        return StaticPartitionPool(layout, SimBackend(), fractions={"swa": 1.0})
    if kind == "oracle":
        return OraclePool(layout, SimBackend())
    return UnifiedPool(layout, backend=SimBackend(materialize=True))


@pytest.mark.parametrize("kind", ["unified", "static", "oracle"])
def test_window_only_replay_keeps_its_accounting_through_hits_evictions_and_retractions(kind):
    # Window 4 tokens, pages of 2: a prompt of 12 releases 4 pages at once.
    # The short requests end with the cached blocks' last window still bound
    # (a hit for the next); 12 pages force evictions and retractions.
    reqs = [Request(i, float(i // 2), *((9, 1) if i % 2 else (12, 6)), (1, 2, 3, 4)) for i in range(12)]
    sim, _ = simulate(window_only_pool(kind), reqs, window=4, block=2, budget=12, max_tokens=100)
    counts = sim.scheduler.counts
    assert counts["finished"] == len(reqs)
    assert sim.mem.evictions > 0 and counts["retracted"] > 0
    assert any(r.hit_tokens for r in reqs)


WINDOW_ONLY = [name for name in list_models() if load_model(name).kinds == ("swa",)]


@pytest.mark.parametrize(("model", "layout"),
                         [(m, k) for m in WINDOW_ONLY for k in applicable_kinds(load_model(m))])
def test_every_bundled_window_only_model_replays_with_its_accounting_checked_every_step(model, layout):
    # A prefix-cached Mooncake slice that crashed at its first cached
    # prefix's eviction when finishing freed the pages the ratchet gave back.
    res = run(RunConfig(trace="mooncake_conversation", max_requests=15, model=model, layout=layout,
                        kv_budget_gib=1.0, oversize="reject", check_every=1))
    assert res.violations == []
    assert res.summary["finished"] > 0 and res.summary["evicted_nodes"] > 0


def test_the_bundled_models_include_a_window_only_one():
    assert "mistral-7b-v0.1" in WINDOW_ONLY


def test_the_clock_moves_by_itself_only_before_every_scheduled_event():
    from unikv.sim.engine import Clock

    env = Clock()
    assert env.advance(0.25) and env.now == 0.25  # nothing scheduled
    env.timeout(1.0)  # due at 1.25
    assert env.advance(0.5) and env.now == 0.75
    assert not env.advance(0.5) and env.now == 0.75  # the timeout falls at the new time: SimPy orders them
    assert not env.advance(2.0) and env.now == 0.75
    assert not env.advance(-0.1) and not env.advance(float("nan")) and env.now == 0.75
    with pytest.raises(ValueError, match="Negative delay"):
        env.timeout(-0.1)  # what the loop yields instead: refused as before
    env.run()
    assert env.now == 1.25


def test_a_replay_is_the_same_when_every_step_yields_a_timeout(monkeypatch):
    from unikv.sim.engine import Clock

    config = RunConfig(trace_end_s=30)
    steps = []
    real = Clock.advance

    def counted(self, delay):
        moved = real(self, delay)
        steps.append(moved)
        return moved

    monkeypatch.setattr(Clock, "advance", counted)
    fast = run(config)
    assert any(steps) and not all(steps)  # both paths taken
    monkeypatch.setattr(Clock, "advance", lambda self, delay: False)
    plain = run(config)
    assert fast.steps.equals(plain.steps) and fast.requests.equals(plain.requests)
    assert fast.summary == plain.summary
