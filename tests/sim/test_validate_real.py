"""benchmarks/validate_real.py's per-request and per-batch comparisons (the
real runs themselves need the H200; these read tables)."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

spec = importlib.util.spec_from_file_location(
    "validate_real", Path(__file__).resolve().parents[2] / "benchmarks" / "validate_real.py")
validate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(validate)


def test_each_request_is_compared_with_itself_and_only_where_both_runs_have_it():
    real = pd.DataFrame({"rid": [0, 1, 2, 3, 4], "ttft_s": [1.0, 2.0, 4.0, 1.0, np.nan],
                         "tpot_s": [0.1, 0.2, np.nan, 0.4, np.nan]})
    # rid 0: +10 % / +10 %; rid 1: -50 % / 0 %; rid 2: +25 %, no TPOT (one token); rid 3 missing in cost;
    # rid 4 never got a first token in the real run; rid 9 only in cost
    cost = pd.DataFrame({"rid": [0, 1, 2, 4, 9], "ttft_s": [1.1, 1.0, 5.0, 1.0, 1.0],
                         "tpot_s": [0.11, 0.2, np.nan, 0.1, 0.1]})
    line = validate.request_line("cell", real, cost)
    ttft = pd.Series([0.1, 0.5, 0.25])
    tpot = pd.Series([0.1, 0.0])
    # TTFT p90 (ms): real over rids 0-3; cost over 0, 1, 2, 4, 9; then with rid 1 (the largest gap, 1 s) at 2.0
    p90 = [1e3 * pd.Series(v).quantile(0.9) for v in ([1.0, 2.0, 4.0, 1.0], [1.1, 1.0, 5.0, 1.0, 1.0],
                                                      [1.1, 2.0, 5.0, 1.0, 1.0])]
    want = (f"| cell | 3 | {100 * ttft.median():.1f} % | {100 * ttft.quantile(0.9):.1f} % | "
            f"{100 * tpot.median():.1f} % | {100 * tpot.quantile(0.9):.1f} % | "
            f"{p90[0]:.1f} / {p90[1]:.1f} / {p90[2]:.1f} |")
    assert line == want
    assert line.startswith("| cell | 3 | 25.0 % | 45.0 % | 5.0 % | 9.0 % | 3400.0 / 3440.0 / 3800.0 |")


def test_decode_steps_are_compared_batch_by_batch():
    real = pd.DataFrame({"prefill_tokens": [0, 0, 0, 10, 0], "decode_tokens": [1, 1, 3, 3, 3],
                         "step_time_s": [0.010, 0.012, 0.020, 0.5, 0.022]})
    cost = pd.DataFrame({"prefill_tokens": [0, 0, 0], "decode_tokens": [1, 2, 3], "step_time_s": [0.009, 0.015, 0.021]})
    cells = validate.batch_line("cell", real, cost).strip("| ").split(" | ")
    assert cells[0] == "cell" and len(cells) == 1 + len(validate.BATCHES)
    assert cells[1:5] == ["11.0 / 9.0", "-", "21.0 / 21.0", "-"]  # batch 3's mixed step is not a decode step


def test_the_cost_run_sizes_memory_as_the_real_run_does():
    # The cost run loads the bundled name (its profile is keyed by it), the real run the
    # config.json: every field but the sources agrees where the file is the bundled model's
    # own, Nemotron-3-Nano's declared fp32 SSM state included (49,082,368 bytes a request).
    import dataclasses

    from unikv.sim.models import load_model

    compared = 0
    for name, path in validate.MODELS.items():
        parsed = load_model(str(path))
        if parsed.name != name:  # gemma-3-12b: a text-only config naming no bundled model
            continue
        cost = load_model(validate.config(name, "azure_conv", "vllm", "cost").model)
        a, b = dataclasses.asdict(cost), dataclasses.asdict(parsed)
        assert {k for k in a if a[k] != b[k]} <= {"sources"}, name
        compared += 1
        if name == "nemotron-3-nano-30b-a3b":
            assert cost.state_bytes == 49_082_368 and cost.ssm_state_dtype == "fp32"
    assert compared >= 2


def test_each_model_is_warmed_once_over_its_slices_before_its_measured_cells(tmp_path, monkeypatch):
    import types

    import unikv.sim.run as sim_run

    calls = []

    def fake_run(cfg):
        calls.append((cfg.model, cfg.trace, cfg.layout))
        steps = pd.DataFrame({"step_time_s": [0.01, 2.5]})
        summary = {"steps": 2, "graph_steps": 2, "finished": 1, "ttft_p50_s": 0.1, "tpot_mean_s": 0.01}
        return types.SimpleNamespace(steps=steps, summary=summary)

    def fake_write_run(result, dest, fmt):
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "summary.json").write_text("{}")

    monkeypatch.setattr(sim_run, "run", fake_run)
    monkeypatch.setattr(sim_run, "write_run", fake_write_run)
    monkeypatch.setattr(validate, "memoize_builds", lambda: None)
    monkeypatch.setattr(validate, "config", lambda model, trace, layout, executor, *a: types.SimpleNamespace(
        model=model, trace=trace, layout=layout))
    selected = validate.cells(["gpt-oss-20b", "nemotron-3-nano-30b-a3b"], ["azure_conv", "azure_code"],
                              ["end_end", "sglang"])
    assert validate.run_real(tmp_path, selected) == 0
    gpt = [c for c in calls if c[0] == "gpt-oss-20b"]
    # two warm-up replays (each slice once, the first layout), then the four measured cells
    assert gpt[:2] == [("gpt-oss-20b", "azure_conv", "end_end"), ("gpt-oss-20b", "azure_code", "end_end")]
    assert sorted(gpt[2:]) == sorted(c for c in selected if c[0] == "gpt-oss-20b") and len(calls) == 12
    assert len(list((tmp_path / "real").iterdir())) == 8  # the warm-up replays are not written
    calls.clear()
    assert validate.run_real(tmp_path / "cold", selected, warm=False) == 0 and len(calls) == 8


def test_each_part_of_a_real_forward_is_set_beside_the_profiles_time_for_it_alone():
    from unikv.sim.profile import StepProfile, profile_path

    profile = StepProfile.load(profile_path("nemotron-3-nano-30b-a3b", "h200"))
    chunk = 1e3 * profile._prefill_at(4095, 0)[0]
    small = 1e3 * profile._prefill_at(1000, 300)[0]
    dec = 1e3 * (profile.decode(4, 2048)[0] + profile.decode_padding_s(4)[0])
    rows = [(1, "chunk", 4095, 0, 1, 1.10 * chunk), (1, "packed", 1000, 300, 1, 0.90 * small),
            (1, "decode", 4, 4 * 2048, 4, 1.02 * dec),
            (1, "forward", 5099, 0, 0, 1.10 * chunk + 0.90 * small + 1.02 * dec + 3.0),
            (1, "step", 5099, 0, 0, 1.10 * chunk + 0.90 * small + 1.02 * dec + 3.5),
            (2, "decode", 4, 4 * 2048, 4, 1.04 * dec), (2, "forward", 4, 0, 0, 1.04 * dec + 0.1),
            (2, "step", 4, 0, 0, 1.04 * dec + 0.6)]
    parts = pd.DataFrame(rows, columns=list(validate.PART_COLUMNS))
    cells = validate.parts_line("cell", parts, profile).strip("| ").split(" | ")
    assert cells[0] == "cell"
    assert cells[1] == f"1.100 (1; {1.10 * chunk:.1f})" and cells[2] == f"0.900 (1; {0.90 * small:.1f})"
    assert cells[3].startswith("1.030 (2; ")  # the median of 1.02 and 1.04
    assert cells[4] == "3.00 (max 3.0)"  # only the step with a chunk: its forward less its three parts
    assert cells[5] == f"0.50 / {1e3 * profile.non_forward_s:.2f}"
