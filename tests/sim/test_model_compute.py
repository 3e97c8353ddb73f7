"""The roofline's attention FLOPs and expert counts read from a user's
config.json (`sim.model_compute`) equal the bundled table
(`sim/data/compute.json`) for every bundled model with a config copy the
plain rule describes, and are left out, with the reason, where it does not;
MLA configs get the prefill (MHA) and decode (absorbed) forms."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from unikv.sim.model_compute import mla_flops
from unikv.sim.models import _bundled, _compute, load_model

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _copies():
    for mid, entry in sorted(_bundled()[0].items()):
        name = Path(entry["sources"].get("config", "").split(":")[-1].split(" ")[0]).name
        if name and (CONFIGS / name).is_file() and mid in _compute():
            yield mid, CONFIGS / name


COPIES = list(_copies())
REFUSED = {"gemma-4-26b-a4b", "mimo-v2-flash"}  # per-kind KV heads / asymmetric K and V


def test_there_are_copies_to_compare():
    assert len(COPIES) >= 8 and {m for m, _ in COPIES} >= REFUSED


@pytest.mark.parametrize("mid,path", COPIES, ids=[m for m, _ in COPIES])
def test_a_config_read_as_a_users_gets_the_bundled_tables_figures(tmp_path, mid, path):
    folder = tmp_path / mid
    folder.mkdir()
    (folder / "config.json").write_text(path.read_text())  # "config.json": not recognised as bundled
    spec = load_model(str(folder))
    table = _compute()[mid]
    moe = table.get("moe") or {}
    want_pairs = (table["attention_pair_flops"]["full"], table["attention_pair_flops"]["window"])
    if mid in REFUSED:
        assert spec.attention_pair_flops is None and "no attention term" in spec.sources["compute"]
    else:
        assert spec.attention_pair_flops == want_pairs, spec.sources["compute"]
    assert (spec.routed_experts, spec.experts_per_token) == (moe.get("routed_experts"), moe.get("experts_per_token"))


# MLA (docs/cost_model.md, "The roofline"): per layer and query head, a prefill pair in the
# non-absorbed form costs 2 (qk_nope + qk_rope + v), a decode pair in the absorbed form
# 2 (kv_lora_rank + qk_rope + kv_lora_rank), a cached token up-projected by kv_b_proj
# 2 kv_lora_rank (qk_nope + v). Figures below are from the configs' fields, by hand.
MLA_BY_HAND = {
    # 27 layers, 16 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128
    "deepseek-ai--DeepSeek-V2-Lite-Chat": (27 * 16 * 2 * 320, 27 * 16 * 2 * 1088, 27 * 16 * 2 * 512 * 256),
    # 61 layers, 128 heads, same head dims (q_lora_rank 1536 does not enter the attention)
    "deepseek-ai--DeepSeek-V3": (61 * 128 * 2 * 320, 61 * 128 * 2 * 1088, 61 * 128 * 2 * 512 * 256),
    "moonshotai--Kimi-K2-Instruct": (61 * 64 * 2 * 320, 61 * 64 * 2 * 1088, 61 * 64 * 2 * 512 * 256),
}


@pytest.mark.parametrize("name", sorted(MLA_BY_HAND))
def test_mla_configs_get_the_prefill_and_decode_forms_by_hand(name):
    spec = load_model(str(CONFIGS / f"{name}_config.json"))
    prefill, decode, cached = MLA_BY_HAND[name]
    assert spec.attention_pair_flops == (prefill, 0), spec.sources["compute"]
    assert spec.mla_flops == (decode, cached)
    assert "MLA attention FLOPs" in spec.sources["compute"]


def test_deepseek_v2_lite_figures_written_out():
    spec = load_model(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite-Chat_config.json"))
    assert (spec.attention_pair_flops, spec.mla_flops) == ((276_480, 0), (940_032, 113_246_208))


@pytest.mark.parametrize("name,arch", [("deepseek-ai--DeepSeek-V3.2", "DeepseekV32ForCausalLM"),
                                       ("zai-org--GLM-5", "GlmMoeDsaForCausalLM")])
def test_a_sparse_attention_indexer_is_refused_by_name(name, arch):
    spec = load_model(str(CONFIGS / f"{name}_config.json"))
    assert spec.attention_pair_flops is None and spec.mla_flops is None
    why = spec.sources["compute"]
    assert why.startswith(f"no attention term: {arch} sparse attention (index_topk=2048") and "MoE" in why


def test_an_mla_config_missing_a_head_dim_is_refused_naming_the_field():
    path = CONFIGS / "deepseek-ai--DeepSeek-V2-Lite-Chat_config.json"
    spec = load_model(str(path))
    config = json.loads(path.read_text()) | {"v_head_dim": None}
    assert mla_flops(config, spec) == (
        None, "no attention term: DeepseekV2ForCausalLM MLA config without a usable v_head_dim")
    no_rope = json.loads(path.read_text()) | {"qk_rope_head_dim": 0}  # NoPE is allowed: rope 0
    assert mla_flops(no_rope, spec)[0] == (27 * 16 * 2 * 256, 27 * 16 * 2 * 1024, 27 * 16 * 2 * 512 * 256)


def test_mla_flops_need_a_prefill_pair_figure_without_window():
    spec = load_model(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite-Chat_config.json"))
    with pytest.raises(ValueError, match="mla_flops=.*needs attention_pair_flops"):
        dataclasses.replace(spec, attention_pair_flops=None)
    with pytest.raises(ValueError, match="mla_flops=.*needs attention_pair_flops"):
        dataclasses.replace(spec, attention_pair_flops=(276_480, 5))
    with pytest.raises(ValueError, match="mla_flops"):
        dataclasses.replace(spec, mla_flops=(1, -1))
