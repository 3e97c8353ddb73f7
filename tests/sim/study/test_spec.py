"""The study file: what it accepts, and errors that name the field path."""

from __future__ import annotations

import copy

import pytest
from unikv.sim.study.spec import load_study, parse_study

BASE = {
    "study": {"name": "s"},
    "traces": [{"trace": "azure_conv", "window_s": [0.0, 10.0], "rate_scales": [1.0, 2.0]}],
    "models": {"names": ["gemma-3-12b"]},
    "budgets": [{"gib": 1.0}, {"derive": "vllm", "mem_fraction": 0.8}],
    "layouts": {"kinds": ["end_end", "fixed_ratio"], "fixed_ratios": [0.5]},
    "scheduler": {"max_running": 64},
    "objectives": {"ttft_p90_s": 2.0},
}


def _with(path: list, value):
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_a_full_study_parses_with_its_values():
    study = parse_study(BASE)
    assert study.traces[0].window_s == (0.0, 10.0)
    assert study.budgets[1].derive == "vllm" and study.budgets[1].mem_fraction == 0.8
    assert study.scheduler.config().max_running == 64
    assert study.study.seeds == [0] and study.layouts.oversize == "reject"


@pytest.mark.parametrize(("path", "value", "words"), [
    (["traces", 0, "speed"], 2, ["traces[0].speed", "unknown key"]),
    (["study", "colour"], "red", ["study.colour", "unknown key"]),
    (["traces", 0, "rates_rps"], [3.0], ["traces[0]", "not both"]),
    (["traces", 0, "window_s"], [5.0, 1.0], ["traces[0]", "start must be < end"]),
    (["traces", 0, "rate_scales"], [0.0], ["traces[0].rate_scales[0]", "greater than 0"]),
    (["budgets", 0, "derive"], "sglang", ["budgets[0]", "exactly one"]),
    (["budgets", 1, "derive"], "tgi", ["budgets[1].derive", "sglang"]),
    (["budgets", 1, "mem_fraction"], 1.5, ["budgets[1].mem_fraction"]),
    (["layouts", "kinds"], ["end_end", "static"], ["layouts.kinds[1]"]),
    (["layouts", "fixed_ratios"], [], ["layouts", "fixed_ratios"]),
    (["scheduler", "reserve_init"], 2.0, ["scheduler.reserve_init"]),
    (["scheduler", "engine"], "tgi", ["scheduler.engine"]),
    (["objectives", "ttft_p90"], 2.0, ["objectives.ttft_p90"]),
    (["study", "seeds"], [-1], ["study.seeds[0]"]),
    (["models", "kv_cache_dtype"], "fp4", ["models.kv_cache_dtype"]),
])
def test_a_bad_field_is_named_by_its_path(path, value, words):
    with pytest.raises(ValueError) as info:
        parse_study(_with(path, value))
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_missing_section_is_named():
    data = copy.deepcopy(BASE)
    del data["budgets"]
    with pytest.raises(ValueError, match="budgets"):
        parse_study(data)


def test_load_study_names_the_file_and_a_toml_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[study\nname = 1\n")
    with pytest.raises(ValueError, match="bad.toml: not a valid TOML file"):
        load_study(path)


def test_the_example_study_loads():
    from pathlib import Path

    study = load_study(Path(__file__).resolve().parents[3] / "studies" / "example.toml")
    assert study.study.name == "example"
