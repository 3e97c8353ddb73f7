"""sim.analyses: trace slices, budgets, sweep bounds, table views, and tiny real runs."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from unikv.sim import analyses as an
from unikv.sim.layouts import StaticRatio, build_layout, check_fits

from unikv import traces

TINY = an.TraceSpec(name="azure_conv", end_s=4.0, rate_scale=2.0, max_requests=8)


def _steps(**cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = {"step_time_s": [1.0] * n, "admitted": [0] * n, "waiting": [0] * n,
            "compaction_overhead": [0.0] * n, "live_bytes": [0] * n}
    return pd.DataFrame({**base, **cols})


# -- trace slices ---------------------------------------------------------------------------

def test_trace_spec_applies_window_clip_rate_and_cap():
    spec = an.TraceSpec(name="mooncake_conversation", start_s=3.0, end_s=30.0, spread_s=3.0,
                        max_context_tokens=4096, rate_scale=2.0, max_requests=20)
    df = spec.load()
    assert len(df) == 20
    assert (df["prompt_tokens"] + df["output_tokens"]).max() <= 4096
    assert df["arrival_s"].min() >= 0 and df["arrival_s"].max() < (30.0 - 3.0) / 2.0
    history = " ".join(spec.describe()["history"])
    assert "window" in history and "clip_to_context" in history and "scale_rate" in history


def test_trace_spec_loads_through_the_simulator_loader():
    from unikv.sim.config import RunConfig
    from unikv.sim.run import load_trace

    spec = an.TraceSpec(name="sharegpt_lengths", end_s=20.0, rate_rps=4.0, max_context_tokens=2048,
                        seed=3)
    pd.testing.assert_frame_equal(spec.load(), load_trace(RunConfig(**spec.run_fields())))
    case = an.Case(trace=spec, model="gpt-oss-20b", kv_budget_gib=1.0)
    assert case.config().rate_rps == 4.0 and case.config().max_context_tokens == 2048


def test_length_only_trace_gets_poisson_arrivals():
    df = an.TraceSpec(name="sharegpt_lengths", end_s=20.0, rate_rps=4.0).load()
    assert 40 <= len(df) <= 120  # ~80 expected
    assert df["arrival_s"].is_monotonic_increasing and df["arrival_s"].max() < 20.0


def test_with_source_reads_the_upstream_file(tmp_path):
    info = traces.samples.info("azure_code")
    shutil.copy(traces.samples.path("azure_code"), tmp_path / info["source"]["file"])
    spec = an.TraceSpec(name="azure_code", end_s=60.0)
    full = spec.with_source(tmp_path)
    assert full.source == str(tmp_path / info["source"]["file"])
    pd.testing.assert_frame_equal(full.load()[["arrival_s", "prompt_tokens"]],
                                  spec.load()[["arrival_s", "prompt_tokens"]])
    with pytest.raises(FileNotFoundError):
        spec.with_source(tmp_path / "nowhere")


def test_empty_slice_is_an_error():
    with pytest.raises(ValueError, match="no request"):
        an.TraceSpec(name="azure_code", start_s=100.0, end_s=101.0).load()


# -- per-run numbers ------------------------------------------------------------------------

def test_stall_time_counts_steps_that_begin_with_a_queue_and_admit_none():
    steps = _steps(step_time_s=[1.0, 2.0, 1.0, 4.0], waiting=[1, 1, 0, 0], admitted=[1, 1, 2, 2])
    # step 1: queue from step 0, none admitted -> stall (2 s); step 2 admits; step 3 no queue
    assert an.step_extras(steps)["stall_time_frac"] == pytest.approx(2.0 / 8.0)


def test_band_demand_is_time_weighted():
    steps = _steps(step_time_s=[1.0, 3.0], swa_live_bytes=[4, 8], full_live_bytes=[2, 2],
                   live_bytes=[6, 10])
    d = an.band_demand(steps)
    assert d["swa_mean_live_bytes"] == 7.0 and d["full_mean_live_bytes"] == 2.0
    assert d["mean_live_bytes"] == 9.0 and d["peak_live_bytes"] == 10


# -- budgets --------------------------------------------------------------------------------

def test_suggested_budget_is_a_fraction_of_demand_rounded_up_above_the_floor():
    assert an.suggest_budget_gib(10 * an.GIB, 1.0, 0.6) == 6.0
    assert an.suggest_budget_gib(10.1 * an.GIB, 1.0, 0.6) == 6.1  # 6.06 rounds up
    assert an.suggest_budget_gib(10 * an.GIB, 8.0, 0.6) == 8.8  # 1.1 x the floor
    assert an.suggest_budget_gib(0.123 * an.GIB, 0.01, 1.0) == 0.13


def test_budget_floor_is_where_the_longest_request_starts_to_fit():
    floor = an.budget_floor_gib(TINY, "gemma-3-12b")
    df = TINY.load()
    longest = int((df["prompt_tokens"] + df["output_tokens"]).max())
    for kind in ("fixed_ratio", "end_end"):
        check_fits(build_layout(an.load_model("gemma-3-12b"), kv_budget_gib=floor, page_size=16, kind=kind),
                   longest, prefill_chunk_tokens=8192)
    with pytest.raises(ValueError):
        check_fits(build_layout(an.load_model("gemma-3-12b"), kv_budget_gib=floor / 1.02, page_size=16,
                                kind="fixed_ratio"), longest, prefill_chunk_tokens=8192)


# -- static ratios --------------------------------------------------------------------------

def test_matched_ratio_follows_the_oracle_mix():
    gemma = an.load_model("gemma-3-12b")
    row = {"swa_mean_live_bytes": 100 * gemma.swa_token_bytes,
           "full_mean_live_bytes": 400 * gemma.full_token_bytes}
    assert an.matched_ratio("gemma-3-12b", row).swa_full_tokens == pytest.approx(0.25)
    row = {"mamba_mean_live_bytes": 3.0, "full_mean_live_bytes": 4.0}
    r = an.matched_ratio("nemotron-3-nano-30b-a3b", row)
    assert r.bands == ("mamba",) and r.mamba_full_memory == pytest.approx(0.75)
    assert an.matched_ratio("llama-3.1-8b", {"full_mean_live_bytes": 1.0}) is None
    assert isinstance(r.as_static_ratio(), StaticRatio)


def test_feasible_factors_bound_the_sweep():
    case = an.Case(trace=TINY, model="gpt-oss-20b", kv_budget_gib=1.0)
    ratio = an.Ratio(bands=("swa",), swa_full_tokens=0.1)
    lo, hi = an.feasible_factors(case, ratio)
    assert lo < 8.0 < hi  # the default 0.8 = 8 x 0.1 is inside
    spec, df = an.load_model("gpt-oss-20b"), TINY.load()
    longest = int((df["prompt_tokens"] + df["output_tokens"]).max())

    def fits(f):
        plan = build_layout(spec, kv_budget_gib=1.0, page_size=16, kind="fixed_ratio",
                            static_ratio=ratio.scaled(f).as_static_ratio())
        try:
            check_fits(plan, longest, prefill_chunk_tokens=8192)
        except ValueError:
            return False
        return True

    assert fits(lo) and fits(hi) and not fits(lo * 0.98) and not fits(hi * 1.02)
    assert an._clamp(lo / 2, (lo, hi)) == round(lo, 6) and an._clamp(1e9, (lo, hi)) == round(hi, 6)


def test_spread_keeps_the_sweep_size_when_clamping_merges_points():
    assert an._spread((0.7, 1.0, 1.4), None) == [0.7, 1.0, 1.4]
    lo_side = an._spread((0.7, 1.0, 1.4), (2.0, 10.0))  # all below the feasible interval
    assert lo_side == [2.0, round(2.0 * an.SWEEP_STEP, 6), round(2.0 * an.SWEEP_STEP ** 2, 6)]
    hi_side = an._spread((0.7, 1.0, 1.4), (0.1, 0.8))
    assert hi_side == [round(0.8 / an.SWEEP_STEP, 6), 0.7, 0.8]
    assert an._spread((0.7, 1.0, 1.4), (0.95, 1.05)) == [0.95, 1.0, 1.05]


# -- table views on a synthetic table of runs ------------------------------------------------

def _runs() -> pd.DataFrame:
    case = {"trace": "t", "model": "m", "kv_budget_gib": 1.0, "rate_scale": 1.0}
    rows = [
        ("oracle", None, np.nan, 10.0, 0, 1.0, None),
        ("static_default", "fixed_ratio", np.nan, 6.0, 0, 3.0, None),
        ("static_sweep", "fixed_ratio", 0.7, 9.0, 1, 1.5, None),   # more running but rejects one
        ("static_sweep", "fixed_ratio", 1.0, 8.0, 0, 2.0, None),
        ("static_sweep", "fixed_ratio", 1.4, 8.0, 0, 1.8, None),   # tie on running: lower TTFT wins
        ("static_sweep", "fixed_ratio", 2.0, np.nan, np.nan, np.nan, "too small"),
        ("unified", "end_end", np.nan, 9.5, 0, 1.2, None),
    ]
    df = pd.DataFrame([{**case, "role": r, "layout": lay, "sweep_factor": f, "mean_running": m,
                        "rejected": rej, "ttft_p90_s": t, "error": e, "throughput_tok_s": m,
                        "compaction": "lazy" if lay == "end_end" else None,
                        "static_swa_full_tokens": f * 0.5 if r != "oracle" and f == f else np.nan}
                       for r, lay, f, m, rej, t, e in rows])
    df.loc[df["role"] == "static_default", "static_swa_full_tokens"] = 0.8
    return an._with_efficiency(df)


def test_best_static_prefers_fewest_rejections_then_capacity_then_ttft():
    best = an.best_static(_runs())
    assert len(best) == 1 and best.iloc[0]["sweep_factor"] == 1.4


def test_headline_rows_and_efficiency():
    table = an.headline(_runs())
    assert list(table["label"]) == ["static (default)", "static (best of sweep)", "end_end/lazy", "oracle"]
    eff = dict(zip(table["label"], table["capacity_efficiency"]))
    assert eff["oracle"] == 1.0 and eff["static (default)"] == 0.6 and eff["end_end/lazy"] == 0.95
    sweep = an.sweep_view(_runs())
    assert sweep["best"].sum() == 1 and sweep.loc[sweep["best"], "sweep_factor"].item() == 1.4


def test_sweep_extends_past_the_end_holding_the_best_then_refines():
    runs = _runs()
    case = an.Case(trace=an.TraceSpec(name="t"), model="m", kv_budget_gib=1.0)
    sweep = runs[runs["role"] == "static_sweep"]
    runs = runs.drop(sweep[sweep["sweep_factor"] == 2.0].index)  # best (1.4) is now the top end
    points = an._static_points(runs, case)
    assert list(points["sweep_factor"]) == [0.7, 1.0, 1.4]  # the default has no factor here
    assert an._extension(points, None) == [round(1.4 * an.SWEEP_STEP, 6)]
    assert an._extension(points, (0.1, 1.4)) == []  # clamped onto an existing point
    assert an._refinement(points, None) == [round(math.sqrt(1.4), 6)]  # between 1.0 and 1.4
    assert an._default_factor(an.Ratio(bands=("swa",)), an.Ratio(bands=("swa",), swa_full_tokens=0.4)) == 2.0
    assert math.isnan(an._default_factor(None, None))


# -- tiny real runs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs():
    cases = [an.Case(trace=TINY, model="gemma-3-12b", kv_budget_gib=1.0),
             an.Case(trace=TINY, model="llama-3.1-8b", kv_budget_gib=0.5)]
    return an.layout_runs(cases, sweep=(1.0,), extend=0, refine=0, compactions=("lazy", "eager"))


def test_layout_runs_roles_and_oracle_reference(tiny_runs):
    gemma = tiny_runs[tiny_runs["model"] == "gemma-3-12b"]
    assert sorted(gemma["role"]) == ["oracle", "static_default", "static_sweep", "unified", "unified"]
    llama = tiny_runs[tiny_runs["model"] == "llama-3.1-8b"]
    assert "static_sweep" not in set(llama["role"])  # one band: nothing to split
    assert (tiny_runs.loc[tiny_runs["role"] == "oracle", "capacity_efficiency"] == 1.0).all()
    assert tiny_runs["error"].isna().all() and (tiny_runs["violations"] == 0).all()
    assert tiny_runs["capacity_efficiency"].between(0.0, 2.0).all()
    table = an.headline(tiny_runs)
    assert set(table["label"]) == {"static (default)", "static (best of sweep)", "end_end/lazy",
                                   "end_end/eager", "oracle"}


def test_eager_lazy_view_charges_every_moved_byte(tiny_runs):
    view = an.eager_lazy_view(tiny_runs)
    assert sorted(view["compaction"]) == ["eager", "eager", "lazy", "lazy"]
    assert np.allclose(view["moved_gib"] * an.GIB * 2 / an._move_bytes_per_s(), view["move_time_all_s"])
    assert (view["move_time_all_s"] >= view["move_time_s"] - 1e-12).all()


def test_capacity_study_returns_step_tables():
    runs = an.capacity_study(TINY, "nemotron-3-nano-30b-a3b", 0.3, layouts=("unified", "oracle"))
    assert list(runs) == ["end_end/lazy", "oracle"]
    steps = runs["end_end/lazy"].steps
    assert {"mamba_live_bytes", "full_high_byte", "available_tokens"} <= set(steps.columns)


def test_results_do_not_depend_on_worker_processes():
    jobs = [an.Job(an.Case(trace=TINY, model="gpt-oss-20b", kv_budget_gib=0.6), (("layout", k),))
            for k in ("oracle", "end_end")]
    one, two = an.run_jobs(jobs, 1), an.run_jobs(jobs, 2)
    cols = ["mean_running", "ttft_p90_s", "moves", "steps"]
    pd.testing.assert_frame_equal(one[cols], two[cols])


# -- the results command --------------------------------------------------------------------

def test_results_command_writes_stamped_tables(tmp_path, monkeypatch):
    from unikv.sim import results_cmd

    monkeypatch.setattr(results_cmd.an, "headline_pairs",
                        lambda **kw: [(TINY, "gemma-3-12b"), (TINY, "nemotron-3-nano-30b-a3b")])
    argv = ["--small", "--out", str(tmp_path), "--jobs", "1"]
    assert results_cmd.main(argv) == 0
    for name in ("calibration", "layouts", "static_sweep", "eager_vs_lazy", "capacity_runs"):
        assert (tmp_path / f"{name}.csv").exists()
        md = (tmp_path / f"{name}.md").read_text()
        assert "python -m unikv.sim.results_cmd --small --out" in md and "azure_conv" in md
        meta = json.loads((tmp_path / f"{name}.json").read_text())
        assert meta["command"].startswith("python -m unikv.sim.results_cmd") and meta["git_revision"]
    for fig in ("layouts.png", "static_sweep.png", "eager_vs_lazy.png", "capacity_gemma-3-12b.png",
                "frontiers_nemotron-3-nano-30b-a3b.png"):
        assert (tmp_path / fig).stat().st_size > 0
    table = pd.read_csv(tmp_path / "layouts.csv")
    assert not math.isnan(table["capacity_efficiency"].iloc[0])
