"""KV budgets as SGLang and vLLM derive them from HBM, weights and a reserve."""

from __future__ import annotations

import pytest
from unikv.sim.study.budget import ENGINE_DEFAULTS, GIB, derive_budget, explicit_budget

H200 = 141 * GIB


def test_sglang_claims_its_fraction_of_hbm_minus_the_weights():
    b = derive_budget("sglang", hbm_capacity_bytes=H200, weight_bytes=24 * 10**9, model="m")
    assert b.kv_budget_bytes == int(H200 * 0.88) - 24 * 10**9
    assert (b.rule, b.mem_fraction, b.activation_reserve_bytes) == ("sglang", 0.88, 0)


def test_vllm_charges_utilization_weights_and_the_activation_reserve():
    b = derive_budget("vllm", hbm_capacity_bytes=H200, weight_bytes=16 * GIB, model="m",
                      mem_fraction=0.8, activation_reserve_gib=2.5)
    assert b.kv_budget_bytes == int(H200 * 0.8) - 16 * GIB - int(2.5 * GIB)
    assert b.weight_bytes == 16 * GIB and b.hbm_capacity_bytes == H200
    default = derive_budget("vllm", hbm_capacity_bytes=H200, weight_bytes=16 * GIB, model="m")
    assert default.mem_fraction == ENGINE_DEFAULTS["vllm"]["mem_fraction"] == 0.9


def test_a_model_whose_weights_do_not_fit_is_refused_naming_the_figures():
    with pytest.raises(ValueError) as info:
        derive_budget("sglang", hbm_capacity_bytes=H200, weight_bytes=140 * GIB, model="llama-3.1-70b")
    text = str(info.value)
    for figure in ("llama-3.1-70b", "does not fit", "0.88", "141.0 GiB", "140.0 GiB", "-15.9 GiB"):
        assert figure in text, text


def test_unknown_weights_and_an_unknown_engine_are_refused():
    with pytest.raises(ValueError, match="weight bytes are unknown"):
        derive_budget("vllm", hbm_capacity_bytes=H200, weight_bytes=None, model="m")
    with pytest.raises(ValueError, match="derive='tgi'"):
        derive_budget("tgi", hbm_capacity_bytes=H200, weight_bytes=1, model="m")


def test_an_explicit_budget_is_its_bytes():
    assert explicit_budget(1.5).kv_budget_bytes == 3 * GIB // 2
