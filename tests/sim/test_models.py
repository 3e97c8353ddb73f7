"""sim.models: bundled models, the config.json parser, ModelSpec validation."""

import json
import shutil
from pathlib import Path

import pytest

from sim.models import ModelSpec, list_models, load_model, parse_config

SHARED = Path(__file__).resolve().parents[3] / "shared"
CONFIGS = sorted((SHARED / "models" / "configs").glob("*.json"))
DATA = Path(__file__).resolve().parents[2] / "sim" / "data"


def _entries() -> dict:
    return {m["id"]: m for m in json.loads((DATA / "models.json").read_text())["models"]}


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
    assert (spec.full_token_bytes, spec.swa_token_bytes, spec.state_bytes) == \
        _expected(entry, state_dtype)
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
    assert other.name == "config" and other.params_total is None and other.weight_bytes is None
    assert other.max_context_tokens == 131072 and other.swa_token_bytes == spec.swa_token_bytes


# -- bundled models ----------------------------------------------------------

@pytest.mark.parametrize("name", list_models())
def test_every_bundled_model_loads_with_sizes(name):
    bf16, fp32 = load_model(name), load_model(name, state_dtype="fp32_ssm")
    entry = _entries()[name]
    assert (bf16.full_token_bytes, bf16.swa_token_bytes, bf16.state_bytes) == _expected(entry, "bf16")
    assert fp32.state_bytes >= bf16.state_bytes
    assert bf16.params_total >= bf16.params_active > 0 and bf16.weight_bytes > 0
    assert bf16.kinds and set(bf16.kinds) <= {"mamba", "swa", "full"}
    assert any(k.startswith("params.") for k in bf16.sources)


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
    with pytest.raises(ValueError, match="no config file"):
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
