"""A study expanded into runs: the grid, content-addressed run ids, derived loads."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import pytest
from unikv.sim.study.grid import expand
from unikv.sim.study.spec import parse_study

from unikv import traces

STUDY = {
    "study": {"name": "g", "seeds": [0, 1]},
    "traces": [{"trace": "azure_conv", "window_s": [0.0, 20.0], "rate_scales": [1.0, 2.0]}],
    "models": {"names": ["gemma-3-12b"]},
    "budgets": [{"gib": 1.0}],
    "layouts": {"kinds": ["end_end", "oracle"], "compactions": ["lazy", "eager"]},
}


def _ids(data) -> list[str]:
    return [s.run_id for s in expand(parse_study(data))]


def test_the_grid_is_every_combination_once():
    specs = expand(parse_study(STUDY))
    # 2 seeds x 2 rates x (end_end lazy + eager, oracle)
    assert len(specs) == len({s.run_id for s in specs}) == 12
    labels = sorted({s.columns["label"] for s in specs})
    assert labels == ["end_end/eager", "end_end/lazy", "oracle"]


def test_others_engine_runs_the_unified_layouts_once_beside_both_baselines():
    both = dict(STUDY, study={"name": "g"}, layouts={"kinds": ["sglang", "vllm", "end_end", "oracle"]})
    every = {(s.columns["label"], s.columns["rate_scale"]): s.run_id for s in expand(parse_study(both))}
    assert sorted({label for label, _ in every}) == ["end_end/lazy@sglang", "end_end/lazy@vllm", "oracle@sglang",
                                                     "oracle@vllm", "sglang", "vllm"]
    one = dict(both, layouts={**both["layouts"], "others_engine": "sglang"})
    specs = expand(parse_study(one))
    assert sorted({s.columns["label"] for s in specs}) == ["end_end/lazy", "oracle", "sglang", "vllm"]
    for s in specs:  # the same runs as the @sglang ones and the baselines: the same ids
        tagged = s.columns["label"] if s.columns["label"] in ("sglang", "vllm") else s.columns["label"] + "@sglang"
        assert every[(tagged, s.columns["rate_scale"])] == s.run_id
    with pytest.raises(ValueError, match="others_engine"):
        parse_study(dict(both, layouts={**both["layouts"], "others_engine": "tgi"}))


def test_the_same_inputs_give_the_same_ids_in_another_process():
    code = ("import json, sys; from unikv.sim.study.grid import expand; from unikv.sim.study.spec import "
            "parse_study; print(json.dumps([s.run_id for s in expand(parse_study(json.loads(sys.argv[1])))]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(STUDY)], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert json.loads(out.stdout) == _ids(STUDY)


@pytest.mark.parametrize(("path", "value"), [
    (["traces", 0, "window_s"], [0.0, 21.0]),
    (["traces", 0, "rate_scales"], [1.5, 2.5]),
    (["budgets", 0, "gib"], 1.25),
    (["scheduler"], {"max_running": 32}),
    (["models", "kv_cache_dtype"], "fp8_e4m3"),
    (["layouts", "page_size"], 32),
    (["objectives"], {"ttft_p90_s": 3.0}),
])
def test_a_changed_input_changes_the_ids(path, value):
    data = copy.deepcopy(STUDY)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert not set(_ids(data)) & set(_ids(STUDY))


def test_a_trace_enters_by_content_not_by_path(tmp_path):
    src = traces.samples.path("azure_conv")
    copy_ = tmp_path / src.name
    shutil.copyfile(src, copy_)
    data = copy.deepcopy(STUDY)
    data["traces"][0]["trace"] = str(copy_)
    assert _ids(data) == _ids(STUDY)
    lines = copy_.read_text().splitlines(keepends=True)
    copy_.write_text("".join(lines[:-1]))  # drop the last request: another trace
    assert not set(_ids(data)) & set(_ids(STUDY))


def test_target_rates_become_rate_scales_of_the_slice():
    data = copy.deepcopy(STUDY)
    data["traces"][0] = {"trace": "azure_conv", "window_s": [0.0, 60.0], "rates_rps": [1.0, 3.0]}
    data["study"]["seeds"] = [0]
    specs = [s for s in expand(parse_study(data)) if s.columns["label"] == "oracle"]
    df = traces.window(traces.load_sample("azure_conv"), start_s=0.0, end_s=60.0)
    natural = len(df) / float(df["arrival_s"].max() - df["arrival_s"].min())
    assert [s.columns["target_rate_rps"] for s in specs] == [1.0, 3.0]
    assert [s.config.rate_scale for s in specs] == pytest.approx([1.0 / natural, 3.0 / natural])


def test_a_budget_the_weights_leave_no_room_for_is_an_inapplicable_run():
    data = copy.deepcopy(STUDY)
    data["models"]["names"] = ["llama-3.1-70b"]
    data["budgets"] = [{"derive": "sglang"}]
    data["gpu"] = {"name": "h200", "hbm_capacity_gib": 80.0}
    specs = expand(parse_study(data))
    assert specs and all(s.config is None for s in specs)
    assert all("does not fit" in s.problem and "80.0 GiB" in s.problem for s in specs)


def test_a_derived_budget_uses_the_gpu_specs_hbm_and_the_models_weights():
    from unikv.sim.cost import HardwareSpec
    from unikv.sim.models import load_model

    data = copy.deepcopy(STUDY)
    data["budgets"] = [{"derive": "sglang"}]
    spec = expand(parse_study(data))[0]
    hbm = HardwareSpec.load("h200").hbm_capacity_bytes
    want = int(hbm * 0.88) - load_model("gemma-3-12b").weight_bytes
    assert spec.columns["kv_budget_bytes"] == want
    assert spec.config.kv_budget_gib * (1 << 30) == pytest.approx(want)
    assert (spec.columns["budget_rule"], spec.columns["hbm_capacity_bytes"]) == ("sglang", hbm)


def test_a_bundled_step_time_profile_enters_the_run_id_and_the_dataset():
    from unikv.sim.study.grid import profile_sha256

    profiled = dict(STUDY, study={"name": "g"}, models={"names": ["gemma-3-12b", "hymba-1.5b-base"]},
                    layouts={"kinds": ["oracle"]})
    specs = expand(parse_study(profiled))
    sha = {s.columns["model"]: s.columns["profile_sha256"] for s in specs}
    assert sha["gemma-3-12b"] == profile_sha256("gemma-3-12b", "h200") and len(sha["gemma-3-12b"]) == 64
    assert sha["hymba-1.5b-base"] is None  # no profile: the roofline


def test_an_unset_later_scheduler_setting_stays_out_of_the_run_id():
    """`mamba_cache_mode` unset (None) keeps a run as it was before the
    setting existed, so finished runs keep their ids; set, it enters the id."""
    import dataclasses

    from unikv.sim.study.grid import UNSET_OMITTED, run_id_of, run_inputs

    config = expand(parse_study(copy.deepcopy(STUDY)))[0].config
    hashes = dict(trace_sha256="t", model_sha256="m", gpu_sha256="g")
    unset = run_inputs(config, **hashes)
    assert "mamba_cache_mode" in UNSET_OMITTED and "mamba_cache_mode" not in unset["scheduler"]
    assert set(config.as_dict()["scheduler"]) - set(unset["scheduler"]) == {"mamba_cache_mode"}
    aligned = dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, mamba_cache_mode="align"))
    both = run_inputs(aligned, **hashes)
    assert both["scheduler"]["mamba_cache_mode"] == "align" and run_id_of(both) != run_id_of(unset)


@pytest.mark.parametrize("name", ["compile_decode", "compile_prefill", "prefill_graphs"])
def test_compile_options_off_stay_out_of_the_run_id(name):
    """`compile_decode`, `compile_prefill` and `prefill_graphs` (added after
    the committed studies ran) enter the run's inputs only when on, so the
    finished runs keep their ids."""
    import dataclasses

    from unikv.sim.study.grid import run_id_of, run_inputs

    config = expand(parse_study(copy.deepcopy(STUDY)))[0].config
    hashes = dict(trace_sha256="t", model_sha256="m", gpu_sha256="g")
    off = run_inputs(config, **hashes)
    assert name in config.as_dict() and name not in off
    assert set(config.as_dict()) - set(off) >= {"compile_decode", "compile_prefill", "prefill_graphs"}
    real = dict(executor="real", kv_cache_dtype="fp32", decode_graphs=True)
    on = run_inputs(dataclasses.replace(config, **{name: True}, **real), **hashes)
    assert run_inputs(dataclasses.replace(config, **real), **hashes).get(name) is None
    assert on[name] is True and run_id_of(on) != run_id_of(off)
