"""vLLM's `mamba_cache_mode` on a mamba hybrid: which state blocks a request
holds, where a prefix hit can land, and what the cached states cost.

Rules followed (docs/models.md, "Baselines: vllm", "Mamba prefix caching"):
vllm/v1/core/sched/scheduler.py `Scheduler._mamba_block_aligned_split`,
vllm/v1/core/single_type_kv_cache_manager.py `MambaManager`
(`allocate_new_blocks`, `remove_skipped_blocks`, `find_longest_cache_hit`),
vllm/config/cache.py `CacheConfig.mamba_cache_mode`.

Qwen3-Next-80B-A3B on the vllm layout (counted in tests/sim/test_vllm.py):
vLLM's block is 544 tokens; 36 linear-attention layers in 3 groups of 12 and
12 full-attention layers in 1 group, so a page of 544 tokens is 1 block and
a state slot is 3 blocks.
"""

import pytest
from unikv.sim.config import RunConfig, SchedulerConfig
from unikv.sim.engines import prefix_cache, rules
from unikv.sim.layouts import build_layout
from unikv.sim.memory import Memory
from unikv.sim.models import load_model
from unikv.sim.prefix_cache import cover_blocks
from unikv.sim.request import Request
from unikv.sim.scheduler import Scheduler
from unikv.sim.vllm_rules import aligned_chunk

from unikv.backends import SimBackend

B = 544  # vLLM's block for Qwen3-Next at the default block size


def qwen_memory(budget_gib=8.0, block=B, align=B):
    plan = build_layout(load_model("qwen3-next-80b-a3b"), kv_budget_gib=budget_gib, page_size=16, kind="vllm")
    assert plan.page_size == B and plan.make_pool(SimBackend()).page_blocks() == {"mamba": 3, "full": 1}
    return Memory(plan.make_pool(SimBackend()), window_tokens=None, block_tokens=block, align_tokens=align)


@pytest.mark.parametrize(("computed", "chunk", "target", "expected"), [
    (0, 8192, 1200, 1088),  # crosses the last block boundary (1088): cut there
    (1088, 112, 1200, 112),  # the tail after it: as it is
    (0, 600, 2000, 544),  # ends before 1632: whole blocks
    (544, 600, 2000, 544),
    (1088, 600, 2000, 544),  # crosses 1632: cut there
    (1632, 368, 2000, 368),
    (0, 500, 2000, 0),  # no whole block fits: the request waits
    (0, 1088, 1088, 1088),  # a prompt of whole blocks: in one chunk
])
def test_aligned_chunk_is_vllms_block_aligned_split(computed, chunk, target, expected):
    assert aligned_chunk(computed, chunk, target, B) == expected


def test_the_mode_defaults_to_v011s_none_and_is_none_without_a_prefix_cache():
    sched = SchedulerConfig()
    assert rules(sched, "vllm").mamba_cache_mode == "none"
    assert rules(SchedulerConfig(engine="vllm"), "end_end").mamba_cache_mode == "none"
    assert rules(SchedulerConfig(mamba_cache_mode="align"), "vllm").mamba_cache_mode == "align"
    # vLLM resets the mode to "none" when prefix caching is off
    assert rules(SchedulerConfig(mamba_cache_mode="align", prefix_cache=False), "vllm").mamba_cache_mode == "none"
    assert rules(sched, "sglang").mamba_cache_mode is None and rules(sched, "end_end").mamba_cache_mode is None


@pytest.mark.parametrize(("mode", "words"), [
    ("all", ["scheduler.mamba_cache_mode='all'", "not modelled"]),
    ("aligned", ["scheduler.mamba_cache_mode='aligned'", "none", "align"]),
])
def test_a_mode_not_modelled_or_not_vllms_is_refused_by_name(mode, words):
    with pytest.raises(ValueError) as exc:
        SchedulerConfig(mamba_cache_mode=mode)
    for w in words:
        assert w in str(exc.value)


def test_another_engines_rules_do_not_read_the_mode():
    # as vLLM's rules do not read SGLang's mamba_cache_strategy: one config
    # drives both engines' groups of `unikv compare`
    align = SchedulerConfig(mamba_cache_mode="align")
    assert rules(align, "sglang").mamba_cache_mode is None
    assert rules(SchedulerConfig(mamba_cache_mode="align", engine="sglang"), "vllm").mamba_cache_mode is None
    assert rules(align, "end_end").mamba_cache_mode is None  # unikv's own rules


def test_align_caches_in_vllms_blocks_and_refuses_what_cannot_hold():
    model = load_model("qwen3-next-80b-a3b")
    align = rules(SchedulerConfig(mamba_cache_mode="align"), "vllm")
    got = prefix_cache(align, model, layout="vllm", page_size=16, requested=None, trace_block=512, enabled=True)
    assert (got.block_tokens, got.align_tokens) == (B, B)
    # no hashes: no cache to keep, vLLM's align rules still bind the state
    got = prefix_cache(align, model, layout="vllm", page_size=16, requested=None, trace_block=None, enabled=True)
    assert (got.block_tokens, got.align_tokens) == (None, B)
    # an attention-only model keeps the trace's blocks
    plain = prefix_cache(align, load_model("llama-3.1-8b"), layout="vllm", page_size=16, requested=None, trace_block=512,
                         enabled=True)
    assert (plain.block_tokens, plain.align_tokens) == (512, None)
    hymba = rules(SchedulerConfig(mamba_cache_mode="align", engine="vllm"), "end_float_end")
    with pytest.raises(ValueError, match=r"scheduler\.mamba_cache_mode='align' .*hymba-1\.5b-base.*meta tokens"):
        prefix_cache(hymba, load_model("hymba-1.5b-base"), layout="end_float_end", page_size=16, requested=None,
                     trace_block=512, enabled=True)
    with pytest.raises(ValueError, match=r"scheduler\.block_tokens=1024 .* 544 tokens"):
        prefix_cache(align, model, layout="vllm", page_size=16, requested=1024, trace_block=512, enabled=True)
    with pytest.raises(ValueError, match=r"scheduler\.prefill_tokens_per_step=512 .*\(544 tokens\)"):
        prefix_cache(align, model, layout="vllm", page_size=16, requested=None, trace_block=512, enabled=True,
                     prefill_tokens_per_step=512)


def test_cover_blocks_keys_a_block_only_where_the_trace_proves_it_shared():
    chained: dict = {}
    # 4 trace blocks of 512 = 2048 tokens: 544-blocks end at 544, 1088, 1632
    # (2176 would need a 5th); each needs the trace blocks through its last token
    first = cover_blocks((1, 2, 3, 4), 512, B, chained)
    assert first == [0, 1, 2] and chained == {(-1, 1, 2): 0, (0, 3): 1, (1, 4): 2}
    # differing in trace block 2 (tokens 1024-1535): only block 0 (tokens 0-543) is shared
    assert cover_blocks((1, 2, 9, 4), 512, B, chained) == [0, 3, 4]
    with pytest.raises(ValueError, match="block=0"):
        cover_blocks((1,), 512, 0, chained)


def test_a_request_holds_one_state_then_two_from_its_second_chunk_then_its_snapshots():
    mem = qwen_memory()
    pool = mem.pool
    a = Request(0, 0.0, 1200, 2, hashes=(1, 2))
    mem.take_hit(a, 0.0)
    assert mem.take_state(a) and pool.live_blocks() == 3  # one state: 3 mamba blocks
    assert mem.extend(a, 1088) and pool.live_blocks() == 3 + 2  # + 2 full-attention pages
    assert mem.extend(a, 112) and pool.live_blocks() == 3 + 3 + 3  # + 1 page, + the previous state
    mem.prefill_done(a)
    assert pool.live_blocks() == 3 + 3
    mem.finish(a, 1.0)
    # cached: the 2 whole prompt blocks' pages and the state at 1088 (the first chunk's end)
    assert pool.live_blocks() == 2 + 3
    assert [(n.depth, n.state is not None) for n in sorted(mem.cache.walk(), key=lambda n: n.depth)] == \
        [(1, False), (2, True)]
    assert pool.verify() == [] and mem.check([]) == []


def test_extend_gives_the_extra_state_back_when_the_pages_do_not_fit():
    mem = qwen_memory(budget_gib=0.3)  # 0.3 GiB: 23 usable blocks
    pool = mem.pool
    assert pool.usable_blocks == 23
    a = Request(0, 0.0, 20 * B, 1)
    mem.take_hit(a, 0.0)
    assert mem.take_state(a) and mem.extend(a, B)  # 3 + 1 blocks
    assert not mem.extend(a, 17 * B)  # 3 more state blocks + 17 pages > 19 free
    assert pool.live_blocks() == 4 and mem.extra_states == {} and mem.check([a]) == []


def replay_hits(budget):
    """Request 0 (1,200 tokens) runs alone with a chunk budget of `budget`;
    then request 1 shares its first 544 tokens and request 2 its first 1,088."""
    mem = qwen_memory(budget_gib=2.0)
    sched = Scheduler(mem, max_running=4, prefill_tokens_per_step=budget, max_tokens=10**6)
    first = Request(0, 0.0, 1200, 1, hashes=(1, 2))
    sched.arrive(first)
    chunks = []
    t = 0.0
    while first.finished_s is None:
        plan = sched.plan(t)
        chunks += [c for r, c in plan.prefill]
        sched.complete(plan, t)
        assert sched.check() == []
        t += 1.0
    one, two = Request(1, t, 2000, 1, hashes=(1, 7, 8)), Request(2, t, 2000, 1, hashes=(1, 2, 9))
    return chunks, len(mem.usable_hit(one)) * B, len(mem.usable_hit(two)) * B


def test_a_hit_lands_only_where_a_prefill_chunk_ended_on_a_block():
    # one chunk budget of 8,192: vLLM cuts 1,200 at 1,088, the last block; the
    # state at 544 was never computed apart, so a request sharing 544 tokens misses
    assert replay_hits(8192) == ([1088, 112], 0, 1088)
    # a budget of 600: chunks of whole blocks, each end's state cached: both hit
    assert replay_hits(600) == ([544, 544, 112], 544, 1088)


def test_under_none_the_vllm_layout_keeps_no_prefix_cache_for_a_mamba_hybrid():
    from unikv.sim.run import run

    base = RunConfig(model="qwen3-next-80b-a3b", trace="mooncake_conversation", layout="vllm",
                     kv_budget_gib=8.0, max_requests=40, oversize="reject", check_every=1)
    none = run(base)
    align = run(base.with_(mamba_cache_mode="align"))
    assert none.violations == [] and align.violations == []
    assert none.identity["prefix_cache"] == {"block_tokens": None, "mamba_cache_mode": "none",
                                             "align_tokens": None}
    assert align.identity["prefix_cache"] == {"block_tokens": B, "mamba_cache_mode": "align",
                                              "align_tokens": B}
    assert none.identity["scheduler"]["mamba_cache_mode"] is None  # the setting as given
    assert (none.identity["vllm"]["prefix_caching"], align.identity["vllm"]["prefix_caching"]) == (False, True)
    assert none.summary["evicted_nodes"] == 0 and none.requests["hit_tokens"].sum() == 0


def test_vllms_maximum_concurrency_counts_two_state_blocks_under_align():
    from unikv.sim.vllm_rules import max_concurrency, vllm_groups

    model = load_model("granite-4.0-h-small")
    groups = vllm_groups(model, 16)
    # full: cdiv(131,072, 528) = 249 blocks; 9 mamba groups x 1 block (none) or 2 (align)
    kw = dict(max_model_len=131_072, max_num_batched_tokens=8192)
    assert max_concurrency(model, groups, 992, **kw) == pytest.approx(992 / (249 + 9))
    assert max_concurrency(model, groups, 992, mamba_cache_mode="align", **kw) == pytest.approx(992 / (249 + 18))
