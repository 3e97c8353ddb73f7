"""Options (issue 14, items 7, 8 and 9 through the CLI): every bad number
or inapplicable option is one line naming it, exit code 2, nothing run and
nothing written; `compare` checks its whole grid first and reports the
cells that cannot run."""

from __future__ import annotations

import pandas as pd
import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli

TINY = ["--trace-end-s", "3", "--no-oracle", "--no-figures", "-q"]
COMPARE = ["compare", "--trace-end-s", "3", "--compactions", "lazy", "-q", "--format", "csv"]


@pytest.fixture
def runs(monkeypatch) -> list:
    """The configs the simulation was started with (by `unikv.sim.run.run`)."""
    import unikv.sim.run as sim_run

    started: list = []
    real = sim_run.run

    def run(config, **kwargs):
        started.append(config)
        return real(config, **kwargs)

    monkeypatch.setattr(sim_run, "run", run)
    return started


@pytest.mark.parametrize(("flags", "words"), [
    (["--kv-budget-gib", "inf"], ["kv_budget_gib", "inf"]),
    (["--kv-budget-gib", "nan"], ["kv_budget_gib", "nan"]),
    (["--kv-budget-gib", "-2"], ["kv_budget_gib", "-2"]),
    (["--rate-scale", "inf"], ["rate_scale", "inf"]),
    (["--rate-rps", "nan"], ["rate_rps", "nan"]),
    (["--spread-s", "inf"], ["spread_s", "inf"]),
    (["--trace-start-s", "nan"], ["trace_start_s", "nan"]),
    (["--trace-start-s", "10", "--trace-end-s", "5"], ["trace_end_s=5.0", "trace_start_s=10.0"]),
    (["--trace-end-s", "inf"], ["trace_end_s", "inf"]),
    (["--reserve-init", "1.5"], ["reserve_init", "1.5"]),
    (["--reserve-min", "-0.1"], ["reserve_min", "-0.1"]),
    (["--reserve-init", "0.1", "--reserve-min", "0.5"], ["reserve_init=0.1", "reserve_min=0.5"]),
    (["--reserve-decay", "inf"], ["reserve_decay", "inf"]),
    (["--reserve-decay", "-1"], ["reserve_decay", "-1"]),
    (["--check-every", "-1"], ["check_every", "-1"]),
    (["--seed", "-1"], ["seed", "-1"]),
    (["--seed", "1.5"], ["seed", "1.5"]),
    (["--page-size", "0"], ["page_size", "0"]),
    (["--max-running", "0"], ["max_running", "0"]),
    (["--static-ratio", "0.5"], ["static_ratio", "0.5", "end_end"]),
    (["--layout", "fixed_ratio", "--static-ratio", "inf"], ["static_ratio", "inf"]),
    (["--layout", "fixed_ratio", "--compaction", "eager"], ["compaction", "eager", "fixed_ratio"]),
    (["--layout", "oracle", "--compaction", "eager"], ["compaction", "eager", "oracle"]),
])
def test_a_bad_replay_option_is_refused_before_anything_runs(tmp_path, runs, flags, words):
    out = tmp_path / "run"
    res = run_cli(["replay", *TINY, *flags, "--out", out])
    assert_refused(res, *words)
    assert runs == [] and not out.exists()


def test_a_budget_this_host_cannot_simulate_is_refused_with_what_it_can_hold(tmp_path):
    out = tmp_path / "run"
    line = assert_refused(run_cli(["replay", *TINY, "--kv-budget-gib", "1e9", "--out", out]),
                          "kv_budget_gib", "1000000000", "host memory", "available", "below")
    assert "MemoryError" not in line and not out.exists()


@pytest.mark.parametrize(("flags", "words"), [
    (["--static-ratios", "inf"], ["static_ratio", "inf"]),
    (["--static-ratios", "0.5", "-1"], ["static_ratio", "-1"]),
    (["--models", "gpt-oss-20b", "no-such-model"], ["no-such-model"]),
    (["--layouts", "end_end", "nope"], ["layouts", "nope"]),
    (["--kv-budget-gib", "1e9"], ["kv_budget_gib", "host memory"]),
])
def test_compare_checks_its_whole_grid_before_the_first_cell(tmp_path, runs, flags, words):
    out = tmp_path / "cmp"
    assert_refused(run_cli([*COMPARE, "--model", "gpt-oss-20b", *flags, "--out", out]), *words)
    assert runs == [] and not out.exists()


def test_a_cell_that_cannot_run_is_reported_and_the_others_run(tmp_path):
    """fixed_ratio@0.01 gives the window band 1 % of the tokens: too little
    for the trace's longest request; the other cells run and are written
    (each engine's group: its baseline, the unified layout, the fixed split
    and the oracle under its rules)."""
    out = tmp_path / "cmp"
    res = run_cli([*COMPARE, "--model", "gpt-oss-20b", "--kv-budget-gib", "0.25", "--static-ratios", "0.01",
                   "--out", out])
    assert res.rc == 3 and "Traceback" not in res.stderr
    assert "skipped gpt-oss-20b fixed_ratio@0.01@sglang: cannot hold" in res.stderr
    table = pd.read_csv(out / "comparison.csv").set_index("label")
    skipped = ["fixed_ratio@0.01@sglang", "fixed_ratio@0.01@vllm"]
    assert (table.loc[skipped, "status"] == "skipped").all()
    assert table.loc[skipped, "reason"].str.contains("longest request").all()
    assert table.loc[skipped, ["mean_running", "throughput_tok_s"]].isna().all().all()
    ran = table.drop(skipped)
    cells = {"sglang", "vllm"} | {f"{x}@{e}" for x in ("fixed_ratio", "end_end/lazy", "oracle")
                                  for e in ("sglang", "vllm")}
    assert set(ran.index) == cells and (ran["status"] == "ok").all()
    for cell in cells:
        folder = out / cell.replace("/", "_").replace("@", "_")
        assert_complete_or_absent(folder, "csv")
        assert (folder / "summary.json").exists()
    assert not (out / "fixed_ratio_0.01_sglang").exists()


def test_a_layout_that_does_not_apply_to_a_model_is_reported(tmp_path):
    out = tmp_path / "cmp"
    res = run_cli([*COMPARE, "--models", "gpt-oss-20b", "hymba-1.5b-base", "--kv-budget-gib", "1",
                   "--layouts", "end_end", "end_float_end", "--out", out])
    assert res.rc == 3
    table = pd.read_csv(out / "comparison.csv")
    skipped = table[table["status"] == "skipped"]
    assert sorted(zip(skipped["model"], skipped["layout"])) == [("gpt-oss-20b", "end_float_end"),
                                                                ("hymba-1.5b-base", "end_end")]
    assert skipped["reason"].str.contains("layouts that apply").all()
    assert (table.loc[table["status"] != "skipped", "status"] == "ok").all() and len(table) == 6
    assert (out / "hymba-1.5b-base" / "end_float_end_lazy" / "summary.json").exists()


@pytest.mark.parametrize("flags", [
    ["--compaction", "eager"],  # with the oracle run, which ignores the mode: it runs lazy
    ["--layout", "fixed_ratio", "--static-ratio", "0.5"],
    ["--trace-start-s", "1", "--trace-end-s", "none", "--max-requests", "5", "--reserve-min", "0"],
])
def test_options_that_apply_still_run(tmp_path, flags):
    out = tmp_path / "run"
    res = run_cli(["replay", "--trace-end-s", "3", "--no-figures", "-q", *flags, "--out", out])
    assert res.rc == 0, res.stderr
    assert_complete_or_absent(out)
