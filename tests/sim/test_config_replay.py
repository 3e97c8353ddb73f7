"""Every public config.json the tests bundle replays from its path, or is refused by name."""

from pathlib import Path

import pytest
from unikv.sim.config import RunConfig
from unikv.sim.layouts import applicable_kinds
from unikv.sim.models import load_model
from unikv.sim.run import run

CONFIGS = sorted((Path(__file__).parents[1] / "data" / "configs").glob("*_config.json"))
REFUSED = {"deepseek-ai--DeepSeek-V4-Flash_config.json": ("DeepseekV4ForCausalLM", "compress_ratios")}
SLICE = dict(trace="azure_conv", max_requests=12, max_context_tokens=256, rate_scale=20.0,
             kv_budget_gib=4.0, check_every=1)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name.removesuffix("_config.json"))
def test_a_config_path_replays_or_is_refused_by_name(path):
    if path.name in REFUSED:
        with pytest.raises(ValueError) as info:
            load_model(path)
        assert all(word in str(info.value) for word in REFUSED[path.name])
        return
    model = load_model(path)
    layout = "end_float_end" if "end_float_end" in applicable_kinds(model) else "end_end"
    config = RunConfig(model=str(path), layout=layout, **SLICE)
    result = run(config)
    assert result.violations == [] and result.summary["finished"] == SLICE["max_requests"]


def test_block_fp8_weight_bytes_of_deepseek_v3():
    """Projections at 1 byte + an fp32 scale per 128x128 block; embeddings and norms in bf16."""
    from unikv.sim.hf_config import load_config
    from unikv.sim.params import count_params

    path = next(p for p in CONFIGS if p.name == "deepseek-ai--DeepSeek-V3_config.json")
    counts = count_params(load_config(path))
    projections = counts.attention + counts.mlp + counts.routed_experts + counts.recurrent
    expected = projections + -(-projections // 16384) * 4 + 2 * (counts.embedding + counts.norms)
    model = load_model(path)
    assert model.weight_bytes == expected and model.params_total == 671_026_404_352
    # about one byte per parameter: the bf16 embeddings and the scales add half a percent
    assert 1.0 < model.weight_bytes / model.params_total < 1.01
