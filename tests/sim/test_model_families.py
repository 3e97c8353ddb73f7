"""sim.models: each architecture family's bytes, pinned by hand on real configs.

Verbatim configs are in tests/data/configs (provenance: its README). Families
with no verbatim copy at hand are given by the fields their published
config.json carries (each marked "reconstructed" with its source).
"""

import json
from pathlib import Path

import pytest
from unikv.sim.layouts import applicable_kinds, build_layout
from unikv.sim.models import load_model, parse_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _config(stem: str) -> dict:
    return json.loads((CONFIGS / f"{stem}_config.json").read_text())


def _kinds(spec) -> dict:
    return {k.name: (k.layers, k.bytes_per_token_per_layer) for k in spec.token_kinds}


# -- MLA: one latent (kv_lora_rank + qk_rope_head_dim) per token per layer, no V --

MLA = [  # (config stem, layers, architecture); all kv_lora_rank 512, qk_rope_head_dim 64
    ("deepseek-ai--DeepSeek-V3", 61, "DeepseekV3ForCausalLM"),
    ("deepseek-ai--DeepSeek-R1", 61, "DeepseekV3ForCausalLM"),
    ("moonshotai--Kimi-K2-Instruct", 61, "DeepseekV3ForCausalLM"),
    ("deepseek-ai--DeepSeek-V2-Lite-Chat", 27, "DeepseekV2ForCausalLM"),  # q_lora_rank null
]


@pytest.mark.parametrize("stem, layers, arch", MLA)
def test_mla_latent_bytes(stem, layers, arch):
    spec = load_model(CONFIGS / f"{stem}_config.json")
    # bf16: (512 + 64) x 2 = 1,152 bytes per token per layer (was read as MHA: 27-41x this)
    assert _kinds(spec) == {"mla_latent": (layers, 1152)}
    assert (spec.full_layers, spec.full_token_bytes, spec.swa_layers, spec.state_layers) == \
        (layers, layers * 1152, 0, 0)
    assert spec.architecture == arch and spec.kinds == ("full",)
    fp8 = load_model(CONFIGS / f"{stem}_config.json", kv_cache_dtype="fp8_e4m3")
    assert fp8.full_token_bytes == layers * 576 and fp8.kv_cache_dtype == "fp8_e4m3"


# -- DeepSeek-V3.2-style sparse attention: MLA latent + indexer keys -------------

@pytest.mark.parametrize("stem, layers", [("deepseek-ai--DeepSeek-V3.2", 61), ("zai-org--GLM-5", 78)])
def test_sparse_mla_latent_and_indexer_keys(stem, layers):
    path = CONFIGS / f"{stem}_config.json"
    spec = load_model(path)
    # indexer keys: 128 fp8 + one fp32 scale per 128 = 132 bytes, whatever the KV dtype
    assert _kinds(spec) == {"mla_latent": (layers, 1152), "indexer_keys": (layers, 132)}
    assert spec.full_layers == layers and spec.full_token_bytes == layers * (1152 + 132)
    fp8 = load_model(path, kv_cache_dtype="fp8_e4m3")
    # vLLM fp8_ds_mla: 512 fp8 + 4 fp32 scales (16) + 64 bf16 RoPE (128) = 656
    assert _kinds(fp8) == {"mla_latent": (layers, 656), "indexer_keys": (layers, 132)}
    assert fp8.token_kinds[0].dtype == "fp8_ds_mla"
    with pytest.raises(ValueError, match="fp8_e5m2.*sparse-attention MLA"):
        load_model(path, kv_cache_dtype="fp8_e5m2")


def test_glm52_shared_indexer_layers_store_no_keys():
    path = CONFIGS / "zai-org--GLM-5.2_config.json"
    spec = load_model(path)
    # indexer_types: 21 "full" of 78 (layers 0, 1, 2, then every 4th from 6); "shared" layers
    # reuse the previous full layer's top-k and hold no indexer (was: 78 indexer layers)
    assert _kinds(spec) == {"mla_latent": (78, 1152), "indexer_keys": (21, 132)}
    assert spec.full_layers == 78 and spec.full_token_bytes == 78 * 1152 + 21 * 132
    text = dict(json.loads(path.read_text()))
    text = dict(text.get("text_config", text))
    derived = {k: v for k, v in text.items() if k != "indexer_types"}  # index_topk_freq 4, offset 3
    assert _kinds(parse_config(derived, name="g")) == _kinds(spec)
    with pytest.raises(ValueError, match="indexer_types"):
        parse_config(dict(text, indexer_types=["full"] * 77 + ["maybe"]), name="g")


def test_families_parse_the_same_after_transformers_defaults():
    """The integrator fills omitted fields from transformers' config classes before parsing."""
    transformers = pytest.importorskip("transformers")
    configs = [KIMI_LINEAR, LFM2, ZAMBA2, GEMMA3N, MAMBA1, MAMBA2] + [
        _config(stem) for stem in ("deepseek-ai--DeepSeek-V3", "deepseek-ai--DeepSeek-V3.2",
                                   "zai-org--GLM-5", "zai-org--GLM-5.2")]
    for config in configs:
        fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
        filled = transformers.AutoConfig.for_model(config["model_type"], **fields).to_dict()
        raw, full = parse_config(config, name="raw"), parse_config(filled, name="filled")
        assert _kinds(raw) == _kinds(full) and raw.state_kinds == full.state_kinds, config["model_type"]


def test_deepseek_v4_is_refused_by_name():
    # Read before as 43 sliding-window layers of window 128: its compressed attention is not that.
    with pytest.raises(ValueError, match="DeepseekV4ForCausalLM.*'compress_ratios'"):
        load_model(CONFIGS / "deepseek-ai--DeepSeek-V4-Flash_config.json")
    with pytest.raises(ValueError, match="compress_ratios"):
        parse_config({"model_type": "deepseek_v4", "num_hidden_layers": 2}, name="v4")


def test_mla_with_sliding_layers_is_refused():
    config = dict(_config("deepseek-ai--DeepSeek-V3"), sliding_window=128,
                  layer_types=["sliding_attention", "full_attention"] * 30 + ["full_attention"])
    with pytest.raises(ValueError, match="MLA.*sliding"):
        parse_config(config, name="x")


# -- Kimi-Linear: MLA layers + KDA layers (recurrent + short-conv state) ----------

# Reconstructed: the fields of moonshotai/Kimi-Linear-48B-A3B-Instruct config.json that the
# geometry uses, as published (1-based layer lists in linear_attn_config).
KIMI_LINEAR = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "num_hidden_layers": 27, "hidden_size": 2304, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 72, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19,
                                          21, 22, 23, 25, 26],
                           "num_heads": 32, "short_conv_kernel_size": 4},
}


def test_kimi_linear_mla_and_kda_state():
    spec = parse_config(KIMI_LINEAR, name="kimi-linear")
    assert _kinds(spec) == {"mla_latent": (7, 1152)}  # was: 27 MHA layers, no state
    assert spec.full_token_bytes == 7 * 1152
    (kda,) = spec.state_kinds
    # vLLM kda_state_shape: conv q, k, v each (4-1) x 32*128; recurrent 32 x 128 x 128
    assert (kda.name, kda.layers, kda.conv_elems, kda.ssm_elems) == ("kda", 20, 36864, 524288)
    assert spec.state_bytes == 20 * (36864 + 524288) * 2 == 22_446_080
    fp32 = parse_config(KIMI_LINEAR, name="kimi-linear", state_dtype="fp32_ssm")
    assert fp32.state_bytes == 20 * (36864 * 2 + 524288 * 4) == 43_417_600
    assert spec.kinds == ("mamba", "full")


def test_kimi_linear_bad_layer_lists_name_the_field():
    bad = json.loads(json.dumps(KIMI_LINEAR))
    bad["linear_attn_config"]["kda_layers"] = bad["linear_attn_config"]["kda_layers"][1:]
    with pytest.raises(ValueError, match="kda_layers"):
        parse_config(bad, name="x")
    del bad["linear_attn_config"]["num_heads"]
    bad["linear_attn_config"]["kda_layers"] = KIMI_LINEAR["linear_attn_config"]["kda_layers"]
    with pytest.raises(ValueError, match="linear_attn_config.num_heads"):
        parse_config(bad, name="x")


# -- KV-shared layers: Gemma-3n, Gemma-4 E-models -------------------------------

# Gemma-3n E4B text config as transformers 5.24.0 `Gemma3nTextConfig()` gives it (its
# docstring names google/gemma-3n-E4B): 35 layers, the last 15 reuse earlier layers' KV.
GEMMA3N_TYPES = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)]
GEMMA3N = {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
           "text_config": {"model_type": "gemma3n_text", "num_hidden_layers": 35,
                           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                           "hidden_size": 2048, "sliding_window": 512, "num_kv_shared_layers": 15,
                           "layer_types": GEMMA3N_TYPES}}


def test_gemma3n_fields_are_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    ref = transformers.Gemma3nTextConfig().to_dict()
    assert {k: ref[k] for k in GEMMA3N["text_config"] if k != "model_type"} == \
        {k: v for k, v in GEMMA3N["text_config"].items() if k != "model_type"}


def test_gemma3n_kv_shared_layers_store_nothing():
    spec = parse_config(GEMMA3N, name="gemma-3n-e4b")
    # 20 storing layers: full at 4, 9, 14, 19; 16 sliding; 2 x (256 + 256) x 2 = 2,048 B each
    assert _kinds(spec) == {"full_attention": (4, 2048), "sliding_window": (16, 2048)}
    assert (spec.full_token_bytes, spec.swa_token_bytes, spec.window_tokens) == (8192, 32768, 512)


def test_gemma4_kv_shared_variant():
    base = _shared_config("google--gemma-4-26B-A4B")
    whole = parse_config(base, name="g4")
    assert (whole.full_layers, whole.swa_layers) == (5, 25)
    text = dict(base["text_config"], num_kv_shared_layers=5)
    shared = parse_config(dict(base, text_config=text), name="g4-shared")
    # the first 25 layers store KV: full at 5, 11, 17, 23 (4 x 4,096 B), 21 sliding (8,192 B)
    assert (shared.full_layers, shared.full_token_bytes) == (4, 16384)
    assert (shared.swa_layers, shared.swa_token_bytes) == (21, 172032)
    with pytest.raises(ValueError, match="num_kv_shared_layers"):
        parse_config(dict(base, text_config=dict(text, num_kv_shared_layers=30)), name="x")


def _shared_config(stem: str) -> dict:
    found = [p / "shared" / "models" / "configs" / f"{stem}_config.json"
             for p in Path(__file__).resolve().parents]
    path = next((p for p in found if p.is_file()), None)
    if path is None:
        pytest.skip(f"no shared copy of {stem}")
    return json.loads(path.read_text())


# -- Zamba2, LFM2, pure recurrent models ----------------------------------------

# Zamba2-2.7B as transformers 5.24.0 `Zamba2Config()` gives it (docstring: Zyphra/Zamba2-2.7B).
ZAMBA2_HYBRID = [6, 12, 18, 24, 30, 36, 42, 47, 51]
ZAMBA2 = {"model_type": "zamba2", "architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": 54,
          "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 32,
          "attention_head_dim": 160, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2,
          "mamba_ngroups": 1, "n_mamba_heads": 8, "mamba_headdim": 640, "num_mem_blocks": 1,
          "layers_block_type": ["hybrid" if i in ZAMBA2_HYBRID else "mamba" for i in range(54)]}


def test_zamba2_each_shared_block_application_keeps_its_kv():
    spec = parse_config(ZAMBA2, name="zamba2-2.7b")
    # 9 applications x 32 heads x (160 + 160) x 2 B; every layer has a Mamba-2 mixer
    assert _kinds(spec) == {"full_attention": (9, 20480)}
    (mamba,) = spec.state_kinds
    # conv (4-1) x (5120 + 2 x 1 x 64), ssm 8 x 640 x 64
    assert (mamba.name, mamba.layers, mamba.conv_elems, mamba.ssm_elems) == ("mamba2", 54, 15744, 327680)
    assert spec.state_bytes == 54 * (15744 + 327680) * 2 == 37_089_792
    no_head_dim = {k: v for k, v in ZAMBA2.items() if k != "attention_head_dim"}
    assert parse_config(no_head_dim, name="z").full_token_bytes == 9 * 20480  # 2 x hidden / heads


def test_zamba2_fields_are_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    ref = transformers.Zamba2Config().to_dict()
    assert ref["hybrid_layer_ids"] == ZAMBA2_HYBRID
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "attention_head_dim", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                "mamba_ngroups", "n_mamba_heads", "mamba_headdim"):
        assert ref[key] == ZAMBA2[key], key


# Reconstructed: LiquidAI/LFM2-1.2B config.json fields (16 layers, attention at 2, 5, 8, 10, 12, 14;
# the published file lists them as `full_attn_idxs`, transformers' Lfm2Config as `layer_types`).
LFM2_FULL = (2, 5, 8, 10, 12, 14)
LFM2 = {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "num_hidden_layers": 16,
        "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3,
        "layer_types": ["full_attention" if i in LFM2_FULL else "conv" for i in range(16)]}


def test_lfm2_short_conv_state():
    spec = parse_config(LFM2, name="lfm2-1.2b")
    assert _kinds(spec) == {"full_attention": (6, 2048)}  # 8 x (64 + 64) x 2
    (conv,) = spec.state_kinds
    assert (conv.name, conv.layers, conv.conv_elems, conv.ssm_elems) == ("short_conv", 10, 4096, 0)
    assert spec.state_bytes == 10 * 2 * 2048 * 2 == 81920
    older = {k: v for k, v in LFM2.items() if k != "layer_types"} | {"full_attn_idxs": list(LFM2_FULL)}
    assert parse_config(older, name="lfm2").state_bytes == 81920


# Constructed with the shapes of state-spaces/mamba-2.8b-hf (Mamba-1) and
# mistralai/Mamba-Codestral-7B-v0.1 (Mamba-2); not copied from their files.
MAMBA1 = {"model_type": "mamba", "architectures": ["MambaForCausalLM"], "num_hidden_layers": 64,
          "hidden_size": 2560, "intermediate_size": 5120, "state_size": 16, "conv_kernel": 4,
          "expand": 2}
MAMBA2 = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "num_hidden_layers": 64,
          "hidden_size": 4096, "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8,
          "conv_kernel": 4, "expand": 2}


def test_pure_recurrent_models_have_state_only():
    m1, m2 = parse_config(MAMBA1, name="mamba1"), parse_config(MAMBA2, name="mamba2")
    assert m1.token_kinds == () and m1.kinds == ("mamba",)
    assert m1.state_bytes == 64 * (3 * 5120 + 5120 * 16) * 2 == 12_451_840
    assert m2.state_bytes == 64 * (3 * (8192 + 2 * 8 * 128) + 128 * 64 * 128) * 2 == 138_149_888
    assert applicable_kinds(m1) == ()
    with pytest.raises(ValueError, match="'mamba1' is state-only"):
        build_layout(m1, kv_budget_gib=1, page_size=16, kind="end_end")


# -- dtypes -----------------------------------------------------------------------

def test_kv_cache_dtypes_scale_attention_bytes_only():
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        spec = load_model("gpt-oss-120b", kv_cache_dtype=dtype)
        assert (spec.full_token_bytes, spec.swa_token_bytes) == (36864 // 2, 36864 // 2)
        assert spec.kv_cache_dtype == dtype and {k.dtype for k in spec.token_kinds} == {dtype}
    qwen = load_model("qwen3-next-80b-a3b", kv_cache_dtype="fp8_e4m3")
    assert qwen.state_bytes == load_model("qwen3-next-80b-a3b").state_bytes
    for bad in ("fp4", "mxfp4"):  # nvfp4 / fp4_e2m1: tests/sim/test_model_kv_fp4.py
        with pytest.raises(ValueError, match=f"'{bad}' is refused: no engine KV-cache layout"):
            load_model("llama-3.1-8b", kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype='int8'"):
        load_model("llama-3.1-8b", kv_cache_dtype="int8")


def test_state_dtypes_declared_by_the_config_win():
    declared = dict(ZAMBA2, mamba_ssm_cache_dtype="float32")
    spec = parse_config(declared, name="z")
    assert (spec.conv_state_dtype, spec.ssm_state_dtype, spec.state_dtype) == ("bf16", "fp32", "fp32_ssm")
    assert spec.state_bytes == 54 * (15744 * 2 + 327680 * 4)
    auto = parse_config(dict(ZAMBA2, mamba_ssm_dtype="auto"), name="z", state_dtype="fp32_ssm")
    assert auto.ssm_state_dtype == "fp32"  # "auto": the caller's default
    with pytest.raises(ValueError, match="mamba_ssm_dtype='float8'"):
        parse_config(dict(ZAMBA2, mamba_ssm_dtype="float8"), name="z")


# -- ModelSpec kinds and the band view ------------------------------------------

def test_band_view_is_derived_from_kinds_and_checked():
    from unikv.sim.model_spec import ModelSpec, StateKind, TokenKind

    full = TokenKind(name="mla_latent", layers=4, bytes_per_token_per_layer=1152)
    index = TokenKind(name="indexer_keys", layers=4, bytes_per_token_per_layer=132)
    swa = TokenKind(name="sliding_window", layers=2, bytes_per_token_per_layer=100, window_tokens=64)
    state = StateKind(name="kda", layers=3, conv_elems=10, ssm_elems=20, ssm_dtype="fp32")
    spec = ModelSpec.from_kinds(name="x", token_kinds=(full, index, swa), state_kinds=(state,))
    assert (spec.full_layers, spec.full_token_bytes) == (4, 4 * 1284)
    assert (spec.swa_layers, spec.swa_token_bytes, spec.window_tokens) == (2, 200, 64)
    assert (spec.state_layers, spec.state_bytes, spec.state_dtype) == (3, 3 * (20 + 80), "fp32_ssm")
    assert spec.kinds == ("mamba", "swa", "full")
    with pytest.raises(ValueError, match="full_token_bytes=8 but its kinds give 4608"):
        ModelSpec(name="x", full_layers=4, full_token_bytes=8, token_kinds=(full,))
    other = TokenKind(name="sliding_window", layers=1, bytes_per_token_per_layer=100, window_tokens=32)
    with pytest.raises(ValueError, match="different windows"):
        ModelSpec.from_kinds(name="x", token_kinds=(full, swa, other))
    with pytest.raises(ValueError, match="window_tokens=None"):
        TokenKind(name="sliding_window", layers=1, bytes_per_token_per_layer=1)
    with pytest.raises(ValueError, match="kv_cache_dtype='fp4'"):
        ModelSpec(name="x", full_layers=1, full_token_bytes=8, kv_cache_dtype="fp4")
