"""sim.layouts: chains, pools, the fixed_ratio split, worst-case request checks."""

import pytest
from unikv.sim.layouts import (
    LAYOUT_KINDS,
    RequestTooLargeError,
    StaticRatio,
    applicable_kinds,
    build_layout,
    check_fits,
    static_fractions,
    static_region_bytes,
    worst_case_request_bytes,
)
from unikv.sim.models import ModelSpec, load_model

from unikv import OraclePool, StaticPartitionPool, UnifiedPool

THREE = ModelSpec(name="three", full_layers=4, swa_layers=12, state_layers=16, window_tokens=512,
                  full_token_bytes=4 * 4096, swa_token_bytes=12 * 4096,
                  state_bytes=16 * 1_000_000, params_total=10**9, params_active=10**9)
MODELS = {
    "dense": load_model("llama-3.1-8b"),
    "swa": load_model("gpt-oss-120b"),
    "mamba": load_model("qwen3-next-80b-a3b"),
    "three": THREE,
}
CHAINS = {
    "dense": "full(down)",
    "swa": "swa(up) | full(down)",
    "mamba": "mamba(up) | full(down)",
    "three": "mamba(up) | swa(float) | full(down)",
}
POOLS = {"fixed_ratio": StaticPartitionPool, "sglang": StaticPartitionPool, "end_end": UnifiedPool, "end_float_end": UnifiedPool,
         "oracle": OraclePool}


def _cases():
    return [(m, k) for m in MODELS for k in applicable_kinds(MODELS[m]) if k != "vllm"]  # test_vllm.py


@pytest.mark.parametrize("model_key, kind", _cases())
def test_every_applicable_kind_builds_a_pool_with_room(model_key, kind):
    model = MODELS[model_key]
    plan = build_layout(model, kv_budget_gib=8, page_size=16, kind=kind)
    assert plan.chain == CHAINS[model_key]
    assert plan.kv_budget_bytes == 8 * 2**30 and plan.page_size == 16
    pool = plan.make_pool(compaction="eager")
    assert type(pool) is POOLS[kind] and plan.pool_class == POOLS[kind].__name__
    assert pool.available_size() > 0
    for band in plan.layout.state_bands:
        assert pool.available_state(band.name) > 0
    assert plan.metadata["layout"] == kind and plan.metadata["model"] == model.name


def test_applicable_kinds():
    assert applicable_kinds(MODELS["dense"]) == ("fixed_ratio", "sglang", "end_end", "oracle", "vllm")
    assert applicable_kinds(MODELS["swa"]) == ("fixed_ratio", "sglang", "end_end", "oracle", "vllm")
    # no architecture SGLang deploys: no sglang layout
    assert applicable_kinds(THREE) == ("fixed_ratio", "end_float_end", "oracle", "vllm")


def test_token_bands_carry_blocks_per_page_and_entry_bytes():
    plan = build_layout(THREE, kv_budget_gib=1, page_size=16, kind="end_float_end")
    bands = {b.name: b for b in plan.layout.bands}
    assert (bands["full"].blocks_per_page, bands["swa"].blocks_per_page) == (8, 24)
    assert bands["mamba"].page_size == 1 and bands["mamba"].entry_bytes == THREE.state_bytes
    assert bands["swa"].entry_bytes == THREE.swa_token_bytes


@pytest.mark.parametrize("model_key", ["dense", "swa", "mamba"])
def test_end_float_end_on_fewer_kinds_says_what_is_missing(model_key):
    with pytest.raises(ValueError, match="end_float_end needs full, swa and mamba") as info:
        build_layout(MODELS[model_key], kv_budget_gib=8, page_size=16, kind="end_float_end")
    msg = str(info.value)
    assert "layouts that apply" in msg and "'end_end'" in msg
    if model_key == "swa":
        assert "no mamba band" in msg
    if model_key == "mamba":
        assert "no swa band" in msg


def test_end_end_on_three_kinds_and_unknown_kind():
    with pytest.raises(ValueError, match="end_float_end"):
        build_layout(THREE, kv_budget_gib=8, page_size=16, kind="end_end")
    with pytest.raises(ValueError, match="fixed_ratio.*sglang.*end_end.*end_float_end.*oracle"):
        build_layout(THREE, kv_budget_gib=8, page_size=16, kind="float")
    assert LAYOUT_KINDS == ("fixed_ratio", "sglang", "end_end", "end_float_end", "oracle", "vllm")


def test_the_old_static_kind_is_refused_naming_its_new_name():
    with pytest.raises(ValueError, match="'static'.*now 'fixed_ratio'"):
        build_layout(MODELS["swa"], kv_budget_gib=8, page_size=16, kind="static")


@pytest.mark.parametrize("kwargs, field", [
    (dict(kv_budget_gib=0, page_size=16), "kv_budget_gib"),
    (dict(kv_budget_gib=8, page_size=0), "page_size"),
    (dict(kv_budget_gib=8, page_size=16, static_ratio="0.8"), "static_ratio"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        build_layout(MODELS["swa"], kind="fixed_ratio", **kwargs)


# -- the fixed_ratio split -----------------------------------------------------------

def test_default_ratios_give_the_documented_fractions():
    # docs/models.md: swa pool tokens = 0.8 x full pool tokens; mamba = 0.9 x full KV bytes.
    swa = static_fractions(MODELS["swa"])  # F == S per token
    assert swa == pytest.approx({"swa": 0.8 / 1.8, "full": 1 / 1.8})
    scout = static_fractions(load_model("llama-4-scout-17b-16e"))  # F 49152, S 147456
    assert scout["swa"] == pytest.approx(0.8 * 147456 / (49152 + 0.8 * 147456))
    assert static_fractions(MODELS["mamba"]) == pytest.approx({"mamba": 0.9 / 1.9, "full": 1 / 1.9})
    three = static_fractions(THREE)
    tokens = 1 / 1.9
    assert three["mamba"] == pytest.approx(0.9 / 1.9)
    assert three["swa"] == pytest.approx(tokens * 0.8 * 3 / (1 + 0.8 * 3))
    assert three["full"] == pytest.approx(tokens / (1 + 0.8 * 3))
    assert static_fractions(MODELS["dense"]) == {"full": 1.0}


def test_static_pool_honours_the_token_ratio_and_the_region_bytes():
    plan = build_layout(MODELS["swa"], kv_budget_gib=8, page_size=16, kind="fixed_ratio")
    regions = static_region_bytes(plan)
    per_page = {b.name: b.page_bytes for b in plan.layout.bands}
    swa_pages, full_pages = (regions[b] // per_page[b] for b in ("swa", "full"))
    assert swa_pages / full_pages == pytest.approx(0.8, abs=2e-3)
    pool = plan.make_pool()
    assert pool.available_size() == min(swa_pages, full_pages) * 16
    mplan = build_layout(MODELS["mamba"], kv_budget_gib=8, page_size=16, kind="fixed_ratio")
    mpool, mreg = mplan.make_pool(), static_region_bytes(mplan)
    assert mpool.available_state("mamba") == mreg["mamba"] // MODELS["mamba"].state_bytes


def test_static_ratio_forms():
    one = build_layout(MODELS["swa"], kv_budget_gib=8, page_size=16, kind="fixed_ratio", static_ratio=0.5)
    assert one.fractions == pytest.approx({"swa": 0.5 / 1.5, "full": 1 / 1.5})
    m = static_fractions(MODELS["mamba"], 1.0)
    assert m == pytest.approx({"mamba": 0.5, "full": 0.5})
    both = static_fractions(THREE, StaticRatio(swa_full_tokens=1.0, mamba_full_memory=1.0))
    assert both["mamba"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="ambiguous"):
        static_fractions(THREE, 0.5)
    with pytest.raises(ValueError, match="swa_full_tokens"):
        StaticRatio(swa_full_tokens=0)
    plan = build_layout(MODELS["swa"], kv_budget_gib=8, page_size=16, kind="end_end",
                        static_ratio=0.5)
    assert plan.fractions is None and plan.static_ratio is None


# -- worst-case requests -------------------------------------------------------------

def test_worst_case_request_bytes_by_hand():
    gpt = MODELS["swa"]  # window 128, 36864 bytes per token in each band
    page = 16 * 36864
    assert worst_case_request_bytes(gpt, 1000, 0, 16) == {"swa": 63 * page, "full": 63 * page}
    chunked = worst_case_request_bytes(gpt, 1000, 24, 16, prefill_chunk_tokens=256)
    assert chunked == {"swa": (24 + 1) * page, "full": 64 * page}  # ceil((128+256)/16)+1
    assert worst_case_request_bytes(MODELS["mamba"], 10, 6, 16) == {
        "mamba": MODELS["mamba"].state_bytes, "full": 16 * 24576}
    with pytest.raises(ValueError, match="prompt_tokens"):
        worst_case_request_bytes(gpt, -1, 0, 16)


def test_check_fits_static_region_too_small_but_unified_fits():
    model = MODELS["mamba"]
    static = build_layout(model, kv_budget_gib=1, page_size=16, kind="fixed_ratio")
    with pytest.raises(RequestTooLargeError, match="band 'full'.*static region"):
        check_fits(static, 24000)
    unified = build_layout(model, kv_budget_gib=1, page_size=16, kind="end_end")
    need = check_fits(unified, 24000)
    pool = unified.make_pool()
    assert pool.alloc(24000) is not None and pool.alloc_state("mamba", 1) is not None
    assert need["full"] == 24000 * 24576
    with pytest.raises(RequestTooLargeError, match="end_end layout has"):
        check_fits(unified, 50000)


def test_check_fits_state_slot_larger_than_its_region():
    model = load_model("nemotron-h-56b")  # 912.6 MB of state per request (NemotronH's fp32 SSM state)
    plan = build_layout(model, kv_budget_gib=2.4, page_size=16, kind="fixed_ratio")
    with pytest.raises(RequestTooLargeError, match="band 'mamba'"):
        check_fits(plan, 16)
    assert check_fits(build_layout(model, kv_budget_gib=2.4, page_size=16, kind="oracle"), 16)


def test_check_fits_agrees_with_a_real_swa_pool():
    plan = build_layout(MODELS["swa"], kv_budget_gib=0.25, page_size=16, kind="end_end")
    tokens = 3000
    need = check_fits(plan, tokens)  # whole prompt in one forward: both bands hold it
    assert need["swa"] == need["full"]
    assert plan.make_pool().alloc(3008) is not None
