"""fp4 KV caches (SGLang `fp4_e2m1`, vLLM `nvfp4`): bytes per token with scales, and refusals."""

import json
from pathlib import Path

import pytest
from unikv.sim.config import RunConfig
from unikv.sim.hf_config import with_defaults
from unikv.sim.layouts import applicable_kinds, build_layout
from unikv.sim.model_configs import parse_config
from unikv.sim.model_spec import kv_token_bytes
from unikv.sim.models import load_model
from unikv.sim.run import run
from unikv.sim.sglang import unsupported_reason

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _parse(name: str, kv: str, **changes):
    raw = json.loads((CONFIGS / f"{name}_config.json").read_text())
    raw.update(changes)
    return parse_config(with_defaults(raw, source=name), name=name, kv_cache_dtype=kv)


@pytest.mark.parametrize("dtype", ["fp4_e2m1", "nvfp4"])
def test_one_head_packs_half_a_byte_per_value_and_a_scale_per_16(dtype):
    # Llama-3.1-8B: 8 KV heads x head_dim 128; K and V each 64 bytes of e2m1 + 8 scale bytes
    assert kv_token_bytes(8, 128, 128, dtype) == 8 * 2 * (64 + 8) == 1152
    assert kv_token_bytes(8, 64, 64, dtype) == 8 * 2 * (32 + 4)  # gpt-oss
    assert kv_token_bytes(8, 128, 128, "bf16") == 4096 and kv_token_bytes(8, 128, 128, "fp8_e4m3") == 2048


def test_bundled_and_parsed_models_agree_in_fp4():
    llama = load_model("llama-3.1-8b", kv_cache_dtype="fp4_e2m1")
    assert llama.full_token_bytes == 32 * 1152 == 36_864  # 9/32 of bf16's 131,072
    assert llama.kv_cache_dtype == "fp4_e2m1"
    parsed = _parse("meta-llama--Meta-Llama-3.1-8B", "fp4_e2m1")
    assert parsed.full_token_bytes == llama.full_token_bytes
    oss = _parse("openai--gpt-oss-20b", "nvfp4")
    assert (oss.full_token_bytes, oss.swa_token_bytes) == (12 * 576, 12 * 576)
    assert load_model("gpt-oss-20b", kv_cache_dtype="nvfp4").full_token_bytes == oss.full_token_bytes


def test_fp4_layouts_that_cannot_be_pinned_are_refused_by_name():
    with pytest.raises(ValueError, match="K head_dim 64 and V head_dim 128"):
        load_model("hymba-1.5b-base", kv_cache_dtype="fp4_e2m1")
    with pytest.raises(ValueError, match="K head_dim 192 and V head_dim 128"):
        load_model("mimo-v2-flash", kv_cache_dtype="fp4_e2m1")
    with pytest.raises(ValueError, match="head_dim 72: .* not a multiple of 16"):
        _parse("meta-llama--Meta-Llama-3.1-8B", "fp4_e2m1", head_dim=72)
    with pytest.raises(ValueError, match="MLA latent .* vLLM defines no fp4 MLA layout"):
        _parse("deepseek-ai--DeepSeek-V3", "fp4_e2m1")
    for name in ("fp4", "mxfp4"):
        with pytest.raises(ValueError, match=f"kv_cache_dtype='{name}' is refused"):
            load_model("llama-3.1-8b", kv_cache_dtype=name)


def test_sglang_fp4_only_for_a_plain_token_pool():
    # gpt-oss gets SGLang's window pool, Nemotron-3-Nano its mamba-hybrid pool: no fp4 rule pinned
    for name in ("gpt-oss-20b", "nemotron-3-nano-30b-a3b"):
        model = load_model(name, kv_cache_dtype="fp4_e2m1")
        assert "MHATokenToKVPoolFP4" in unsupported_reason(model)
        assert "sglang" not in applicable_kinds(model) and "vllm" in applicable_kinds(model)
        assert "sglang" in applicable_kinds(load_model(name, kv_cache_dtype="fp8_e4m3"))
    # Gemma-3 is outside SGLang's window allowlist: one plain pool, so fp4 applies
    assert "sglang" in applicable_kinds(load_model("gemma-3-12b", kv_cache_dtype="fp4_e2m1"))


def test_vllm_block_bytes_follow_nvfp4_page_size():
    plan = build_layout(load_model("llama-3.1-8b", kv_cache_dtype="nvfp4"), kv_budget_gib=4,
                        page_size=16, kind="vllm")
    meta = plan.metadata["vllm"]
    # AttentionSpec.real_page_size_bytes: 2 x block x heads x (head/2 + head/16) per layer, 32 layers
    assert meta["block_bytes"] == 32 * 2 * 16 * 8 * (64 + 8)
    assert meta["num_blocks"] == (4 << 30) // meta["block_bytes"]


def test_fp4_run_is_recorded_and_clean():
    small = dict(trace="azure_conv", max_requests=6, max_context_tokens=64, model="llama-3.1-8b",
                 kv_budget_gib=1.0, check_every=1)
    result = run(RunConfig(**small, kv_cache_dtype="fp4_e2m1"))
    assert result.identity["dtypes"]["kv_cache"] == "fp4_e2m1" and result.violations == []
