"""sim/real/layers.py: the per-layer cache read from a transformers config, held
against the bands unikv's build_layout makes for the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from unikv.sim.layouts import build_layout
from unikv.sim.models import load_model
from unikv.sim.real.layers import check_layout, check_recurrent, model_layers

from unikv import Band, Layout

CONFIGS = Path(__file__).parents[2] / "data" / "configs"
# Gemma-3-12B's text shape (google/gemma-3-12b-pt config.json's text_config), as the
# bundled "gemma-3-12b" describes it: 48 layers, every 6th full, window 1024.
GEMMA3_12B = dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=256, sliding_window=1024, sliding_window_pattern=6)


def hub_config(stem: str):
    data = json.loads((CONFIGS / f"{stem}_config.json").read_text())
    return transformers.AutoConfig.for_model(data.pop("model_type"), **data)


def end_layout(model):
    kind = "end_float_end" if len(model.kinds) == 3 else "end_end"
    return build_layout(model, kv_budget_gib=1, page_size=16, kind=kind).layout


def test_gemma3_layers_match_the_bundled_model_layout():
    cfg = transformers.Gemma3TextConfig(**GEMMA3_12B)
    layers = model_layers(cfg, torch.bfloat16)
    assert layers.kinds == tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(48))
    assert [s.layer for s in layers.kv if s.band == "full"] == [5, 11, 17, 23, 29, 35, 41, 47]
    assert {(s.num_kv_heads, s.head_dim_k, s.head_dim_v) for s in layers.kv} == {(8, 256, 256)}
    assert layers.window(0) == 1024 and layers.window(5) is None
    check_layout(layers, end_layout(load_model("gemma-3-12b")))


@pytest.mark.parametrize("stem, bundled", [("openai--gpt-oss-20b", "gpt-oss-20b"),
                                           ("meta-llama--Meta-Llama-3.1-8B", "llama-3.1-8b"),
                                           ("Qwen--Qwen3-Next-80B-A3B-Thinking", "qwen3-next-80b-a3b")])
def test_hub_configs_match_build_layout(stem, bundled):
    cfg = hub_config(stem)
    layers = model_layers(cfg, torch.bfloat16)
    check_layout(layers, end_layout(load_model(CONFIGS / f"{stem}_config.json")))
    check_layout(layers, end_layout(load_model(bundled)))
    if bundled.startswith("qwen3-next"):  # gated DeltaNet layers keep state, no KV
        assert len(layers.recurrent) == 36 and len(layers.kv) == 12
    else:
        assert layers.recurrent == ()


def test_check_layout_names_the_band_and_both_figures():
    cfg = hub_config("openai--gpt-oss-20b")
    layout = end_layout(load_model("gpt-oss-20b"))
    with pytest.raises(ValueError, match="band 'full'.*49152 bytes per token.*holds 24576"):
        check_layout(model_layers(cfg, torch.float32), layout)
    one_band = Layout(total_bytes=2**24, bands=[Band("full", entry_bytes=49152, page_size=16,
                                                     blocks_per_page=48)])
    with pytest.raises(ValueError, match="band 'swa'"):
        check_layout(model_layers(cfg, torch.bfloat16), one_band)
    folded = model_layers(cfg, torch.bfloat16, bands={"sliding": "full"})  # every layer on one band
    check_layout(folded, one_band)
    wrong_blocks = Layout(total_bytes=2**24, bands=[Band("full", entry_bytes=49152, page_size=16)])
    with pytest.raises(ValueError, match="48 blocks per page.*blocks_per_page=1"):
        check_layout(folded, wrong_blocks)


def test_configs_it_cannot_describe_are_refused_by_field():
    with pytest.raises(ValueError, match="sliding_window=4096 without layer_types"):
        model_layers(transformers.MistralConfig(sliding_window=4096), torch.bfloat16)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        model_layers(hub_config("deepseek-ai--DeepSeek-V3"), torch.bfloat16)
    cfg = transformers.LlamaConfig(num_hidden_layers=2)
    cfg.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="chunked_attention"):
        model_layers(cfg, torch.bfloat16)
    cfg.layer_types = ["full_attention"]
    with pytest.raises(ValueError, match="num_hidden_layers=2"):
        model_layers(cfg, torch.bfloat16)


def test_check_recurrent_names_the_unbound_recurrent_layers_and_their_types():
    check_recurrent(model_layers(hub_config("openai--gpt-oss-20b"), torch.bfloat16))  # attention only
    cfg = hub_config("Qwen--Qwen3-Next-80B-A3B-Thinking")
    layers = model_layers(cfg, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^layers \[0, 1, 2, 4, .*\] keep recurrent state \(linear_attention\) "
                                         r"of qwen3_next, which the real executor cannot bind"):
        check_recurrent(layers, cfg)
    with pytest.raises(ValueError, match=r"^layers \[2, 4, .*\] keep recurrent state"):
        check_recurrent(layers, cfg, bound=(0, 1))  # only the unbound ones are named
    check_recurrent(layers, cfg, bound=layers.recurrent)


def test_nemotron_h_feed_forward_layers_keep_no_cache():
    """Nemotron-H's "mlp" / "moe" layers (`NemotronHConfig.layer_types`) hold neither KV nor state."""
    cfg = transformers.NemotronHConfig(hybrid_override_pattern="M*M-E", num_hidden_layers=5)
    layers = model_layers(cfg, torch.bfloat16)
    assert cfg.layer_types[3:] == ["mlp", "moe"] and layers.kinds[3:] == ("none", "none")
    assert layers.recurrent == (0, 2) and [s.layer for s in layers.kv] == [1]


def test_legacy_layer_type_names_read_as_transformers_remaps_them():
    """"mamba" / "attention" (older transformers' Nemotron-H names) are
    "linear_attention" / "full_attention" (transformers 5.24's
    `_LEGACY_LAYER_TYPE_REMAP`)."""
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4)
    cfg.layer_types = ["mamba", "attention", "mlp"]
    assert model_layers(cfg, torch.bfloat16).kinds == ("recurrent", "full", "none")
