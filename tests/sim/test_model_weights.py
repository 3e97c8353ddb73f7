"""sim.model_weights: stored weight bytes of quantized and unquantized checkpoints."""

import json
from pathlib import Path

import pytest
from unikv.sim.hf_config import with_defaults
from unikv.sim.model_weights import checkpoint_weight_bytes, kept_by_pattern
from unikv.sim.params import count_params

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"

# `metadata.total_size` of each checkpoint's model.safetensors.index.json on
# Hugging Face (the bytes of every stored tensor): openai/gpt-oss-20b
# 13,761,264,768 and openai/gpt-oss-120b 65,248,815,744. OpenAI's model card
# (arXiv 2508.10925, Table 1) rounds them to 12.8 GiB and 60.8 GiB.
GPT_OSS_TOTAL_SIZE = {"20b": 13_761_264_768, "120b": 65_248_815_744}


def _filled(name: str, **changes) -> dict:
    raw = json.loads((CONFIGS / f"{name}_config.json").read_text())
    raw.update(changes)
    return with_defaults(raw, source=name)


def _bytes(filled: dict) -> tuple[int | None, str]:
    return checkpoint_weight_bytes(filled, count_params(filled))


@pytest.mark.parametrize("size", sorted(GPT_OSS_TOTAL_SIZE))
def test_gpt_oss_mxfp4_checkpoint_bytes_equal_the_published_total_size(size):
    weight, how = _bytes(_filled(f"openai--gpt-oss-{size}"))
    assert weight == GPT_OSS_TOTAL_SIZE[size]
    assert "MXFP4" in how


def test_gpt_oss_20b_by_hand():
    # 24 layers x 32 experts x (2 x 2880 x 2880 + 2880 x 2880) weights: 4 bits + one
    # scale byte per 32; the other 1,804,459,584 parameters (attention, router,
    # expert biases, embeddings, norms) in bf16.
    experts = 24 * 32 * 3 * 2880 * 2880
    assert experts == 19_110_297_600
    assert experts // 2 + experts // 32 + (20_914_757_184 - experts) * 2 == GPT_OSS_TOTAL_SIZE["20b"]


def test_modules_to_not_convert_keeps_named_experts_in_bf16():
    base = json.loads((CONFIGS / "openai--gpt-oss-20b_config.json").read_text())["quantization_config"]
    per_layer = 32 * 3 * 2880 * 2880
    # "model.layers.1" keeps layer 1 (and not layers 10-19); ".*experts" suffixes keep nothing more
    quant = dict(base, modules_to_not_convert=base["modules_to_not_convert"] + ["model.layers.1"])
    one, _ = _bytes(_filled("openai--gpt-oss-20b", quantization_config=quant))
    assert one - GPT_OSS_TOTAL_SIZE["20b"] == per_layer * 2 - (per_layer // 2 + per_layer // 32)
    quant = dict(base, modules_to_not_convert=["model.layers.*.mlp.experts"])
    every, how = _bytes(_filled("openai--gpt-oss-20b", quantization_config=quant))
    assert every == 20_914_757_184 * 2 and "0 MXFP4" in how


def test_mxfp4_layouts_that_cannot_be_pinned_are_named():
    weight, how = _bytes(_filled("openai--gpt-oss-20b", intermediate_size=2880 + 16))
    assert weight is None and "intermediate_size = 2896 is not a multiple of 32" in how
    llama = _filled("meta-llama--Meta-Llama-3.1-8B", quantization_config={"quant_method": "mxfp4"})
    weight, how = _bytes(llama)
    assert weight is None and "model_type 'llama'" in how
    weight, how = _bytes(_filled("meta-llama--Meta-Llama-3.1-8B",
                                 quantization_config={"quant_method": "compressed-tensors"}))
    assert weight is None and "'compressed-tensors'" in how


def test_bad_modules_to_not_convert_is_refused_naming_the_field():
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"}
    with pytest.raises(ValueError, match="modules_to_not_convert = 'lm_head'"):
        _bytes(_filled("openai--gpt-oss-20b", quantization_config=quant))


def test_unquantized_and_block_fp8_checkpoints():
    llama = _filled("meta-llama--Meta-Llama-3.1-8B")
    weight, how = _bytes(llama)
    assert weight == count_params(llama).total * 2 and "bfloat16" in how
    weight, how = _bytes(_filled("deepseek-ai--DeepSeek-V3"))
    assert weight is not None and "128x128 block" in how


PATTERN_CASES = [
    ("model.layers.1", "model.layers.1.mlp.experts", True),
    ("model.layers.1", "model.layers.11.mlp.experts", False),
    ("model.layers.*.self_attn", "model.layers.3.self_attn", True),
    ("model.layers.*.mlp.router", "model.layers.3.mlp.experts", False),
    ("model.layers.", "model.layers.3.mlp.experts", True),
    ("experts", "model.layers.3.mlp.experts", True),
    ("mlp.exp", "model.layers.3.mlp.experts", False),
    ("lm_head", "model.layers.3.mlp.experts", False),
    ("model.layers.(2|3)", "model.layers.3.mlp.experts", True),
]


@pytest.mark.parametrize(("pattern", "name", "kept"), PATTERN_CASES)
def test_kept_by_pattern(pattern, name, kept):
    assert kept_by_pattern(name, [pattern]) is kept


def test_kept_by_pattern_agrees_with_transformers():
    utils = pytest.importorskip("transformers.quantizers.quantizers_utils")
    names = [f"model.layers.{i}.mlp.experts" for i in (0, 1, 3, 11, 23)]
    for pattern, _, _ in PATTERN_CASES:
        for name in names:
            assert kept_by_pattern(name, [pattern]) is not utils.should_convert_module(name, [pattern]), \
                (pattern, name)


@pytest.mark.parametrize("size", sorted(GPT_OSS_TOTAL_SIZE))
def test_bundled_gpt_oss_weight_bytes_are_the_derived_checkpoint_bytes(size):
    from unikv.sim.models import load_model
    weight, _ = _bytes(_filled(f"openai--gpt-oss-{size}"))
    assert load_model(f"gpt-oss-{size}").weight_bytes == weight
