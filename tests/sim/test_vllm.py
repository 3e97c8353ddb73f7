"""sim.vllm_rules and the `vllm` layout: vLLM's KV-cache groups, block size,
sizing and prefix-caching rules, pinned against figures vLLM documents or logs.

Sources (docs/models.md, "Baselines: vllm"):
- vLLM's design doc `docs/design/hybrid_kv_cache_manager.md` (vllm-project/vllm
  @1153c0c8): the 10 full + 20 sliding-window example (block 16, window 32, a
  112-token request holds 11 blocks) and Gemma-3-27B's groups (52 sliding +
  10 full layers -> groups of 10, the last sliding group padded with 8 layers).
- A vLLM 0.11.1rc6 start-up log of ibm-granite/granite-4.0-h-small at
  tensor-parallel 1, bf16 (github.com/ROCm/ROCm/issues/5590): "Setting
  attention block size to 528 tokens to ensure that attention page size is >=
  mamba page size." and "Padding mamba page size by 0.69% ..."; its engine
  config shows `enable_prefix_caching=False`.
"""

import pytest
from unikv.sim.config import SchedulerConfig
from unikv.sim.engines import prefix_cache, rules
from unikv.sim.layouts import applicable_kinds, build_layout, check_fits
from unikv.sim.memory import Memory
from unikv.sim.models import ModelSpec, load_model
from unikv.sim.request import Request
from unikv.sim.vllm_rules import max_concurrency, vllm_groups

from unikv.backends import SimBackend
from unikv.baselines import VllmPool

GIB = 2**30


def spec(full=0, swa=0, state=0, window=None, token=4096, state_layer=0, **kw) -> ModelSpec:
    return ModelSpec(name="m", full_layers=full, swa_layers=swa, state_layers=state, window_tokens=window,
                     full_token_bytes=full * token, swa_token_bytes=swa * token,
                     state_bytes=state * state_layer, **kw)


def test_granite_block_size_and_padding_as_vllm_logs_them():
    groups = vllm_groups(load_model("granite-4.0-h-small"), 16)
    assert groups.block_tokens == 528  # 16 x cdiv(2,147,840, 16 x 4,096)
    assert round(groups.mamba_padding_pct(), 2) == 0.69
    assert groups.prefix_caching is False  # the log's enable_prefix_caching=False
    # 4 attention + 36 mamba layers: groups of 4 layers, 1 full + 9 mamba groups.
    assert (groups.group_layers, dict(groups.groups)) == (4, {"mamba": 9, "full": 1})


# nvidia/NVIDIA-Nemotron-Nano-9B-v2's geometry (its config.json): 56 layers, 4 of them attention.
NANO_9B_V2 = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
              "hidden_size": 4480, "intermediate_size": 15680, "num_hidden_layers": 56,
              "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
              "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
              "mamba_head_dim": 80, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_nemotron_h_block_size_follows_the_ssm_state_dtype_vllm_keeps():
    # vllm-project/vllm#24280 (2025-09): "large attention page sizes (672 tokens for
    # nvidia/NVIDIA-Nemotron-Nano-9B-v2)", when vLLM kept the state in the model dtype
    # ("auto"): 16 x cdiv(3 x 12,288 x 2 + 128 x 80 x 128 x 2, 16 x 4,096) = 672. Since
    # vllm#29978 NemotronH takes the config's mamba_ssm_cache_dtype, and since vllm#39032 float32
    # where the config is silent (NemotronHConfig's own default): the SSM half doubles, 1,312.
    from unikv.sim.hf_config import with_defaults
    from unikv.sim.models import parse_config

    auto = parse_config(with_defaults({**NANO_9B_V2, "mamba_ssm_cache_dtype": "auto"}), name="nano-9b-v2")
    assert (auto.state_layers, auto.full_layers, auto.ssm_state_dtype) == (27, 4, "bf16")
    assert vllm_groups(auto, 16).block_tokens == 672
    silent = parse_config(with_defaults(NANO_9B_V2), name="nano-9b-v2")
    assert silent.ssm_state_dtype == "fp32"
    assert vllm_groups(silent, 16).block_tokens == 1312


def test_a_configured_block_larger_than_the_state_needs_is_kept():
    assert vllm_groups(load_model("granite-4.0-h-small"), 1024).block_tokens == 1024


def test_gemma3_27b_groups_as_vllms_design_doc_lists_them():
    groups = vllm_groups(load_model("gemma-3-27b"), 16)
    assert (groups.group_layers, dict(groups.groups)) == (10, {"swa": 6, "full": 1})
    plan = build_layout(load_model("gemma-3-27b"), kv_budget_gib=8, page_size=16, kind="vllm")
    swa = plan.layout.geometry("swa").band
    assert swa.entry_bytes == 60 * 8192  # 52 layers + 8 padding layers, 8 KiB per token each


def test_the_one_and_a_half_rule_pads_instead_of_splitting():
    # vLLM's comment: gpt-oss-20b + eagle (12 sliding + 13 full) -> (13 sw, 13 full).
    groups = vllm_groups(spec(full=13, swa=12, window=128), 16)
    assert (groups.group_layers, dict(groups.groups)) == (13, {"swa": 1, "full": 1})


def test_a_request_holds_the_blocks_of_vllms_design_doc_example():
    # 10 full + 20 sliding layers, block 16, window 32: a 112-token request
    # holds 11 blocks (7 full, 2 per sliding group).
    model = spec(full=10, swa=20, window=32)
    plan = build_layout(model, kv_budget_gib=0.25, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    mem = Memory(pool, window_tokens=32, block_tokens=None)
    req = Request(0, 0.0, 112, 1)
    mem.take_hit(req, 0.0)
    assert mem.extend(req, 112)
    mem.ratchet([req])
    assert pool.live_blocks() == 11
    assert pool.verify() == []


def test_num_blocks_and_kv_cache_tokens_follow_vllms_formulas():
    model = load_model("gpt-oss-120b")  # 18 full + 18 sliding layers, 2,048 B per token and layer
    groups = vllm_groups(model, 16)
    budget = 40 * GIB
    # get_num_blocks: memory // (16 x 2,048) // 18 layers per group
    assert groups.num_blocks(budget) == budget // 32_768 // 18 == 72_817
    # _report_kv_cache_config: blocks // 2 groups x 16 tokens
    assert groups.kv_cache_tokens(72_817) == 36_408 * 16
    plan = build_layout(model, kv_budget_gib=40, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    assert (pool.total_blocks, pool.usable_blocks) == (72_817, 72_816)
    assert plan.metadata["vllm"]["kv_cache_tokens"] == 582_528


def test_max_concurrency_counts_each_groups_worst_case():
    model = load_model("gpt-oss-120b")
    groups = vllm_groups(model, 16)
    # full: cdiv(131,072, 16) = 8,192 blocks; sliding: cdiv(127 + 8,192, 16) + 1 = 521.
    got = max_concurrency(model, groups, 72_817, max_model_len=131_072, max_num_batched_tokens=8192)
    assert got == pytest.approx(72_817 / (8_192 + 521))
    mamba = load_model("granite-4.0-h-small")
    g = vllm_groups(mamba, 16)
    # full: cdiv(131,072, 528) = 249 blocks; 9 mamba groups x 1 block.
    assert max_concurrency(mamba, g, 992, max_model_len=131_072, max_num_batched_tokens=8192) == \
        pytest.approx(992 / (249 + 9))


def test_a_state_costs_every_mamba_groups_block():
    plan = build_layout(load_model("granite-4.0-h-small"), kv_budget_gib=8, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    assert pool.page_blocks() == {"mamba": 9, "full": 1}
    assert pool.available_state("mamba") == pool.usable_blocks // 9
    assert plan.page_size == 528


@pytest.mark.parametrize(("name", "layout", "block"), [
    ("granite-4.0-h-small", "vllm", None),  # v0.11: no prefix caching for a mamba hybrid
    ("granite-4.0-h-small", "end_end", 512),  # the simulator's own cache, under vLLM's rules too
    ("gemma-3-12b", "vllm", 512),  # attention-only: vLLM caches (the window hit rule)
    ("llama-3.1-8b", "vllm", 512),
])
def test_the_engine_rules_decide_the_prefix_cache_of_a_vllm_run(name, layout, block):
    model = load_model(name)
    state = rules(SchedulerConfig(), layout) if layout == "vllm" else rules(SchedulerConfig(engine="vllm"), layout)
    got = prefix_cache(state, model, layout=layout, page_size=16, requested=None, trace_block=512, enabled=True)
    assert (got.block_tokens, got.align_tokens) == (block, None)


def test_memory_keeps_the_cache_it_is_given_on_a_vllm_pool():
    # the memory layer asks no pool type: the engine rules decided the block above
    plan = build_layout(load_model("granite-4.0-h-small"), kv_budget_gib=8, page_size=16, kind="vllm")
    mem = Memory(plan.make_pool(SimBackend()), window_tokens=None, block_tokens=528)
    assert mem.cache is not None and mem.cache.block_tokens == 528
    assert Memory(plan.make_pool(SimBackend()), window_tokens=None, block_tokens=None).cache is None


@pytest.mark.parametrize(("name", "words"), [
    ("gemma-4-26b-a4b", ["per-layer KV bytes", "different block sizes"]),
    ("hymba-1.5b-base", ["meta tokens"]),
])
def test_models_vllm_cannot_describe_one_way_are_refused_by_name(name, words):
    model = load_model(name)
    assert "vllm" not in applicable_kinds(model)
    with pytest.raises(ValueError) as exc:
        build_layout(model, kv_budget_gib=8, page_size=16, kind="vllm")
    for w in [name, *words]:
        assert w in str(exc.value)


def test_a_request_too_long_for_the_blocks_is_named():
    plan = build_layout(load_model("gpt-oss-20b"), kv_budget_gib=0.05, page_size=16, kind="vllm")
    with pytest.raises(ValueError, match="vllm layout"):
        check_fits(plan, 100_000)  # within the model's 131,072-token context


def test_plan_makes_a_vllm_pool_with_vllms_blocks():
    plan = build_layout(load_model("qwen3-next-80b-a3b"), kv_budget_gib=8, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    assert isinstance(pool, VllmPool) and plan.pool_class == "VllmPool"
    assert pool.block_bytes == plan.vllm.block_bytes == 12 * 544 * 2048
    assert plan.metadata["vllm"]["block_tokens"] == 544


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-oss-120b", "qwen3-next-80b-a3b", "falcon-h1-7b",
                                  "llama-4-scout-17b-16e", "mistral-7b-v0.1"])
def test_every_model_it_applies_to_builds_a_pool_with_room(name):
    model = load_model(name)
    assert "vllm" in applicable_kinds(model)
    plan = build_layout(model, kv_budget_gib=8, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    assert pool.available_size() > 0 and pool.verify() == []
    for band in plan.layout.state_bands:
        assert pool.available_state(band.name) > 0
    assert plan.metadata["layout"] == "vllm" and plan.metadata["vllm"]["num_blocks"] == pool.total_blocks


@pytest.mark.parametrize(("name", "trace", "budget"), [
    ("gpt-oss-20b", "azure_conv", 0.3),
    ("granite-4.0-h-small", "azure_conv", 2.0),
    ("gemma-3-12b", "mooncake_conversation", 2.0),  # prefix hashes: the window hit rule
])
def test_replays_on_vllm_pass_every_check(name, trace, budget):
    from unikv.sim.config import RunConfig
    from unikv.sim.run import run

    res = run(RunConfig(model=name, trace=trace, layout="vllm", kv_budget_gib=budget, trace_end_s=20,
                        max_requests=60, check_every=1, oversize="reject"))
    assert res.violations == []
    assert res.summary["finished"] > 0
    assert res.identity["vllm"]["num_blocks"] > 0
    assert res.identity["page_size"] == res.identity["vllm"]["block_tokens"]


def test_a_window_model_resumes_from_blocks_still_in_the_window():
    # vLLM's hit rule for full + sliding groups (HybridKVCacheCoordinator):
    # the full prefix must be cached and the sliding groups' last window of it.
    model = spec(full=1, swa=5, window=32)
    plan = build_layout(model, kv_budget_gib=0.01, page_size=16, kind="vllm")
    pool = plan.make_pool(SimBackend())
    mem = Memory(pool, window_tokens=32, block_tokens=16)
    first = Request(0, 0.0, 64, 1, hashes=(1, 2, 3, 4))
    mem.take_hit(first, 0.0)
    assert mem.extend(first, 64)
    mem.ratchet([first])  # pages 0-1 left the window: their sliding blocks are back
    held = pool.live_blocks()
    assert held == 4 * 1 + 2 * 5
    mem.finish(first, 1.0)
    assert pool.live_blocks() == held  # the cache keeps them
    second = Request(1, 2.0, 80, 1, hashes=(1, 2, 3, 4, 5))
    assert len(mem.usable_hit(second)) == 4  # 64 tokens: the window before the cut is still held
    assert pool.verify() == [] and mem.check([]) == []
