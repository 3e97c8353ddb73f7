"""sim.models: bundled models, the config.json parser, ModelSpec validation."""

import json
import shutil
from pathlib import Path

import pytest
from unikv.sim.models import ModelSpec, list_models, load_model, parse_config

# The bundled models' source configs live in the team's shared folder beside the checkout.
SHARED = next((p / "shared" for p in Path(__file__).resolve().parents
               if (p / "shared" / "models" / "configs").is_dir()), Path("/nonexistent/shared"))
CONFIGS = sorted((SHARED / "models" / "configs").glob("*.json"))
DATA = Path(__file__).resolve().parents[2] / "sim" / "data"


def _entries() -> dict:
    return {m["id"]: m for m in json.loads((DATA / "models.json").read_text())["models"]}


def _declared_dtype(entry: dict, state_dtype: str) -> str:
    """The state dtype a model gets: its config's declared SSM dtype wins over the caller's."""
    declared = entry.get("state", {}).get("config_declared_ssm_state_dtype", "")
    return "fp32_ssm" if declared.startswith("float32") else state_dtype


def _expected(entry: dict, state_dtype: str) -> tuple:
    per_token, state = entry["per_token_kv_bytes"], entry["per_request_state_bytes"]
    key = "mamba_if_ssm_fp32" if state_dtype == "fp32_ssm" else "mamba"
    return (per_token.get("full", 0), per_token.get("swa", per_token.get("chunked", 0)),
            state.get(key, 0))


# -- the parser reproduces models.json on every verbatim config --------------

@pytest.mark.skipif(not CONFIGS, reason=f"no shared configs under {SHARED}")
@pytest.mark.parametrize("state_dtype", ["bf16", "fp32_ssm"])
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_parser_reproduces_models_json(path, state_dtype):
    spec = load_model(path, state_dtype=state_dtype)
    entry = _entries()[spec.name]  # the file name maps to its bundled model
    # A config that declares its SSM-state dtype (Qwen3.5, Nemotron-3-Nano: float32), or leaves
    # it to transformers' default (NemotronH: float32), gets it whatever the caller's default.
    expected_dtype = _declared_dtype(entry, state_dtype)
    assert (spec.full_token_bytes, spec.swa_token_bytes, spec.state_bytes) == \
        _expected(entry, expected_dtype)
    assert spec.state_dtype == expected_dtype
    assert (spec.architecture, spec.model_type) == (entry["architecture"], entry["model_type"])
    by_type = entry["layers_by_type"]
    assert spec.full_layers == by_type.get("full", 0)
    assert spec.swa_layers == by_type.get("swa", by_type.get("chunked", 0))
    assert spec.state_layers == by_type.get("mamba", 0) + by_type.get("linear", 0)
    pools = entry["attention_pools"]
    window = pools.get("swa", pools.get("chunked", {})).get("window_tokens")
    assert (spec.window_tokens, spec.chunked) == (window, "chunked" in pools)


@pytest.mark.skipif(not CONFIGS, reason=f"no shared configs under {SHARED}")
def test_path_matching_a_bundled_config_gets_its_name_and_params(tmp_path):
    spec = load_model(SHARED / "models/configs/openai--gpt-oss-120b_config.json")
    assert spec.name == "gpt-oss-120b" and spec.params_active == load_model("gpt-oss-120b").params_active
    copy = shutil.copy(SHARED / "models/configs/openai--gpt-oss-120b_config.json", tmp_path / "config.json")
    other = load_model(str(copy))
    # a model folder's config.json takes the folder's name; its sizes are counted from the file
    # (sim.params), its weight bytes from its MXFP4 layout (sim.model_weights)
    assert other.name == tmp_path.name and other.params_total == 116_829_156_672
    assert other.weight_bytes == 65_248_815_744 and "MXFP4" in other.sources["params"]
    assert other.max_context_tokens == 131072 and other.swa_token_bytes == spec.swa_token_bytes


# -- bundled models ----------------------------------------------------------

@pytest.mark.parametrize("name", list_models())
def test_every_bundled_model_loads_with_sizes(name):
    bf16, fp32 = load_model(name), load_model(name, state_dtype="fp32_ssm")
    entry = _entries()[name]
    assert (bf16.full_token_bytes, bf16.swa_token_bytes, bf16.state_bytes) == \
        _expected(entry, _declared_dtype(entry, "bf16"))
    assert bf16.state_dtype == _declared_dtype(entry, "bf16")
    assert fp32.state_bytes >= bf16.state_bytes
    assert bf16.params_total >= bf16.params_active > 0 and bf16.weight_bytes > 0
    assert bf16.kinds and set(bf16.kinds) <= {"mamba", "swa", "full"}
    assert any(k.startswith("params.") for k in bf16.sources)


BUNDLED_COPIES = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32_ssm"])
@pytest.mark.parametrize("stem", ["nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia--Nemotron-H-56B-Base-8K",
                                  "Qwen--Qwen3.5-397B-A17B", "Qwen--Qwen3-Next-80B-A3B-Thinking"])
def test_a_bundled_name_and_its_config_size_the_state_alike(stem, state_dtype):
    # vLLM resolves mamba_ssm_cache_dtype="auto" to the config's value for NemotronH (float32 when
    # the file is silent) and Qwen3.5 (vllm/model_executor/models/config.py
    # NemotronHForCausalLMConfig, Qwen3_5ForConditionalGenerationConfig); Qwen3-Next keeps the
    # caller's default. The name and the file must agree under either default.
    parsed = load_model(BUNDLED_COPIES / f"{stem}_config.json", state_dtype=state_dtype)
    named = load_model(parsed.name, state_dtype=state_dtype)
    assert parsed.name in list_models()
    assert (named.state_bytes, named.state_dtype, named.ssm_state_dtype) == \
        (parsed.state_bytes, parsed.state_dtype, parsed.ssm_state_dtype)
    fixed = "Qwen3-Next" not in stem
    assert (named.ssm_state_dtype == "fp32") == (fixed or state_dtype == "fp32_ssm")


def test_params_json_covers_every_model_with_a_source_and_a_verification():
    params = json.loads((DATA / "params.json").read_text())["models"]
    assert set(params) == set(list_models())
    for name, entry in params.items():
        assert entry["sources"]["params"] and entry["verification"], name


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError, match="gpt-oss-120b") as info:
        load_model("no-such-model")
    assert "llama-3.1-8b" in str(info.value)


def test_missing_config_file_and_bad_state_dtype():
    with pytest.raises(ValueError, match="no such file"):
        load_model("/nonexistent/config.json")
    with pytest.raises(ValueError, match="state_dtype"):
        load_model("llama-3.1-8b", state_dtype="fp8")


# -- parser rules on reconstructed configs (numbers from models.json) -------

def _parse(**config):
    return parse_config(config, name="t")


def test_jamba_period_offset_mamba1():
    spec = _parse(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                  num_key_value_heads=8, attn_layer_period=8, attn_layer_offset=4,
                  mamba_d_state=16, mamba_d_conv=4, mamba_expand=2)
    assert (spec.full_layers, spec.state_layers) == (4, 28)
    assert (spec.full_token_bytes, spec.state_bytes) == (16384, 8716288)


def test_minimax_attn_type_list_lightning():
    spec = _parse(num_hidden_layers=80, hidden_size=6144, num_attention_heads=64, head_dim=128,
                  num_key_value_heads=8, attn_type_list=([0] * 7 + [1]) * 10,
                  model_type="minimax_text_01")
    assert (spec.full_token_bytes, spec.state_bytes) == (40960, 146800640)


def test_falcon_h1_parallel_hybrid():
    spec = _parse(model_type="falcon_h1", num_hidden_layers=44, num_attention_heads=12,
                  num_key_value_heads=2, head_dim=128, mamba_d_ssm=3072, mamba_n_heads=24,
                  mamba_d_head=128, mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4,
                  mamba_expand=2)
    assert (spec.full_layers, spec.state_layers) == (44, 44)
    assert (spec.full_token_bytes, spec.state_bytes) == (45056, 70152192)


def test_granite_layer_types_mamba2():
    spec = _parse(num_hidden_layers=40, hidden_size=4096, num_attention_heads=32,
                  num_key_value_heads=8, layer_types=["mamba"] * 36 + ["attention"] * 4,
                  mamba_n_heads=128, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1,
                  mamba_d_conv=4, mamba_expand=2)
    assert (spec.full_token_bytes, spec.state_bytes) == (16384, 77322240)


def test_gemma2_and_gemma3_patterns_and_text_config():
    g2 = _parse(model_type="gemma2", num_hidden_layers=42, num_attention_heads=16,
                num_key_value_heads=8, head_dim=256, sliding_window=4096)
    assert (g2.full_token_bytes, g2.swa_token_bytes, g2.window_tokens) == (172032, 172032, 4096)
    g3 = parse_config({"text_config": dict(
        model_type="gemma3_text", num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, sliding_window=1024, sliding_window_pattern=6)},
        name="g3")
    assert (g3.full_layers, g3.swa_layers) == (8, 40)
    assert (g3.full_token_bytes, g3.swa_token_bytes) == (65536, 327680)


def test_mistral_all_sliding_and_qwen2_switches():
    m = _parse(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
               num_key_value_heads=8, sliding_window=4096)
    assert (m.full_layers, m.swa_layers, m.swa_token_bytes) == (0, 32, 131072)
    off = _parse(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                 sliding_window=4096, use_sliding_window=False)
    assert (off.full_layers, off.swa_layers) == (4, 0)
    q2 = _parse(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                sliding_window=64, max_window_layers=3)
    assert (q2.full_layers, q2.swa_layers) == (3, 1)


# -- bad configs name the missing field ---------------------------------------

@pytest.mark.parametrize("config, field", [
    (dict(hidden_size=64), "num_hidden_layers"),
    (dict(num_hidden_layers=2), "num_attention_heads"),
    (dict(num_hidden_layers=2, num_attention_heads=4), "hidden_size"),
    (dict(num_hidden_layers=2, num_attention_heads=4, head_dim=16,
          layer_types=["sliding_attention", "full_attention"]), "sliding_window"),
    (dict(num_hidden_layers=2, num_attention_heads=4, head_dim=16,
          hybrid_override_pattern="M*"), "mamba_num_heads"),
    (dict(num_hidden_layers=2, num_attention_heads=4, head_dim=16,
          hybrid_override_pattern="M*", mamba_num_heads=8), "mamba_head_dim"),
    (dict(num_hidden_layers=2, num_attention_heads=4, head_dim=16,
          layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4),
     "linear_num_key_heads"),
    (dict(num_hidden_layers=4, num_attention_heads=4, head_dim=16, attn_layer_period=2),
     "attn_layer_offset"),
])
def test_bad_config_names_the_missing_field(config, field):
    with pytest.raises(ValueError, match=field):
        parse_config(config, name="bad")


def test_bad_layer_pattern_values_and_lengths():
    with pytest.raises(ValueError, match="layer_types holds 'cross_attention'"):
        _parse(num_hidden_layers=1, num_attention_heads=4, head_dim=16,
               layer_types=["cross_attention"])
    with pytest.raises(ValueError, match="3 entries, num_hidden_layers=2"):
        _parse(num_hidden_layers=2, num_attention_heads=4, head_dim=16,
               hybrid_override_pattern="M*-")


def test_bad_config_file_is_a_value_error(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(bad)


# -- ModelSpec validation -----------------------------------------------------

def test_modelspec_validates_its_fields():
    with pytest.raises(ValueError, match="window_tokens"):
        ModelSpec(name="x", full_layers=1, swa_layers=1, full_token_bytes=8, swa_token_bytes=8)
    with pytest.raises(ValueError, match="state_bytes"):
        ModelSpec(name="x", full_layers=1, full_token_bytes=8, state_layers=2)
    with pytest.raises(ValueError, match="params_active"):
        ModelSpec(name="x", full_layers=1, full_token_bytes=8, params_total=1, params_active=2)
    with pytest.raises(ValueError, match="full_layers"):
        ModelSpec(name="x", full_layers=-1)
    spec = ModelSpec(name="x", full_layers=1, full_token_bytes=8, sources={"a": "b"})
    assert hash(spec) == hash(ModelSpec(name="x", full_layers=1, full_token_bytes=8))


# -- Hymba-1.5B: full + sliding + Mamba in every layer, KV sharing, meta tokens --

# The fields of nvidia/Hymba-1.5B-Base config.json that the geometry uses
# (sources: sim/data/models.json, entry "hymba-1.5b-base").
HYMBA_GROUPS = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14], [16, 17, 18],
                [19, 20], [21, 22], [23, 24], [25, 26], [27, 28], [29, 30]]
HYMBA = dict(model_type="hymba", num_hidden_layers=32, hidden_size=1600, attn_hidden_size=-1,
             num_attention_heads=25, num_key_value_heads=5, kq_head_dim=-1, v_head_dim=128,
             global_attn_idx=[0, 15, 31], kv_reuse_group=HYMBA_GROUPS, kv_reuse_every_i_layer=-1,
             layer_type=["h"] * 32, sliding_window=1024, num_memory_tokens=128,
             memory_tokens_interspersed_every=0, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
             conv_dim={str(i): 3200 for i in range(32)}, max_position_embeddings=8192)


def test_hymba_bytes_recomputed_by_hand():
    spec = parse_config(HYMBA, name="hymba")
    # KV per token per layer: 5 KV heads x (K 1600/25 = 64 + V 128) x 2 bytes.
    per_layer = 5 * (64 + 128) * 2
    assert per_layer == 1920
    # Full: layers 0, 15, 31, none shares. Sliding: the other 29 layers, in 14
    # kv_reuse_groups; only the first layer of a group stores K/V.
    assert sorted(set(range(32)) - {0, 15, 31}) == sorted(i for g in HYMBA_GROUPS for i in g)
    assert (spec.full_layers, spec.swa_layers, spec.state_layers) == (3, 14, 32)
    assert spec.full_token_bytes == 3 * per_layer == 5760
    assert spec.swa_token_bytes == 14 * per_layer == 26880
    # Mamba-1 in every layer (vLLM shapes): conv (d_conv-1, d_inner), ssm (d_inner, d_state).
    d_inner = 2 * 1600
    conv, ssm = 3 * d_inner, d_inner * 16
    assert spec.state_bytes == 32 * (conv + ssm) * 2 == 3_891_200
    assert parse_config(HYMBA, name="h", state_dtype="fp32_ssm").state_bytes == \
        32 * (conv * 2 + ssm * 4) == 7_168_000
    assert (spec.window_tokens, spec.meta_tokens, spec.kinds) == (1024, 128, ("mamba", "swa", "full"))
    # One request of L tokens: full (L + 128), sliding (min(L, 1024) + 128) tokens, one state.
    for tokens in (1, 1000, 1024, 8192):
        expected = ((tokens + 128) * 5760 + (min(tokens, 1024) + 128) * 26880 + 3_891_200)
        assert spec.request_bytes(tokens) == expected
    assert spec.request_bytes(8192) == 82_780_160
    # The meta tokens alone: 128 x (3 + 14) x 1920 bytes per request.
    assert spec.request_bytes(0) - spec.state_bytes == 128 * 17 * 1920 == 4_177_920


def test_hymba_bundled_entry_matches_the_parser():
    spec, bundled = parse_config(HYMBA, name="h"), load_model("hymba-1.5b-base")
    fields = ("full_layers", "swa_layers", "state_layers", "window_tokens", "full_token_bytes",
              "swa_token_bytes", "state_bytes", "meta_tokens", "max_context_tokens")
    assert [getattr(bundled, f) for f in fields] == [getattr(spec, f) for f in fields]
    assert load_model("hymba-1.5b-base", state_dtype="fp32_ssm").state_bytes == 7_168_000
    entry = _entries()["hymba-1.5b-base"]
    assert entry["attention_layers_by_type"] == {"full": 3, "swa": 29}
    assert "partially verified" in bundled.sources["geometry.verification"]


def test_hymba_without_sharing_or_meta_tokens():
    plain = parse_config(dict(HYMBA, kv_reuse_group=None, num_memory_tokens=0), name="h")
    assert (plain.full_layers, plain.swa_layers, plain.meta_tokens) == (3, 29, 0)
    assert plain.swa_token_bytes == 29 * 1920
    assert plain.request_bytes(100) == 100 * (5760 + 29 * 1920) + 3_891_200
    mixed = parse_config(dict(HYMBA, layer_type=["a"] + ["h"] * 30 + ["m"]), name="h")
    assert (mixed.full_layers, mixed.state_layers) == (2, 31)  # layer 31 has no attention


def test_hymba_end_float_end_layout():
    from unikv.sim.layouts import applicable_kinds, build_layout

    model = load_model("hymba-1.5b-base")
    assert "end_float_end" in applicable_kinds(model)
    plan = build_layout(model, kv_budget_gib=0.5, page_size=16, kind="end_float_end")
    bands = {b.name: b for b in plan.layout.bands}
    assert list(bands) == ["mamba", "swa", "full"]
    assert (bands["swa"].entry_bytes, bands["swa"].blocks_per_page) == (26880, 28)
    assert (bands["full"].entry_bytes, bands["full"].blocks_per_page) == (5760, 6)
    assert bands["mamba"].entry_bytes == 3_891_200


@pytest.mark.parametrize("change, message", [
    (dict(global_attn_idx=None), "global_attn_idx"),
    (dict(num_key_value_heads=None), "num_key_value_heads"),
    (dict(global_attn_idx=[0, 32]), "global_attn_idx holds"),
    (dict(layer_type=["h"] * 31), "layer_type has 31 entries"),
    (dict(layer_type=["h"] * 31 + ["x"]), "layer_type holds 'x'"),
    (dict(kv_reuse_group=[[14, 15]]), "kv_reuse_group"),  # sliding + full in one group
    (dict(kv_reuse_group=[[1, 2], [2, 3]]), "kv_reuse_group"),  # layer in two groups
    (dict(kv_reuse_group=None, kv_reuse_every_i_layer=2), "kv_reuse_every_i_layer"),
    (dict(memory_tokens_interspersed_every=64), "memory_tokens_interspersed_every"),
    (dict(mamba_expand=None), "state shape"),
])
def test_hymba_bad_config_names_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        parse_config({k: v for k, v in dict(HYMBA, **change).items() if v is not None}, name="bad")


def test_modelspec_meta_tokens_validation():
    with pytest.raises(ValueError, match="meta_tokens"):
        ModelSpec(name="x", full_layers=0, state_layers=1, state_bytes=8, meta_tokens=4)
    with pytest.raises(ValueError, match="meta_tokens"):
        ModelSpec(name="x", full_layers=1, full_token_bytes=8, meta_tokens=-1)
