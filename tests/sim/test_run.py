"""End-to-end runs on small slices: determinism, outputs, bad input."""

import json

import pandas as pd
import pytest
from unikv.sim.cli import compare, replay
from unikv.sim.config import RunConfig
from unikv.sim.layouts import RequestTooLargeError, build_layout, check_fits
from unikv.sim.models import load_model
from unikv.sim.run import load_trace, run, write_run

from unikv import traces

SMALL = dict(trace="azure_conv", trace_end_s=20.0, model="gpt-oss-20b", kv_budget_gib=1.0, check_every=25)


def test_same_inputs_same_outputs():
    a = run(RunConfig(**SMALL))
    b = run(RunConfig(**SMALL))
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary == b.summary
    assert a.violations == [] and a.summary["finished"] == a.summary["arrived"] > 20


@pytest.mark.parametrize(("layout", "compaction"), [("fixed_ratio", "lazy"), ("sglang", "lazy"),
                                                  ("end_end", "eager"), ("oracle", "lazy"), ("vllm", "lazy")])
def test_every_layout_runs_and_keeps_invariants(layout, compaction):
    res = run(RunConfig(**SMALL, layout=layout, compaction=compaction))
    assert res.violations == []
    assert res.summary["finished"] == res.summary["arrived"]


def test_prefix_cache_on_a_mooncake_slice():
    res = run(RunConfig(trace="mooncake_conversation", trace_end_s=15.0, model="llama-3.1-8b",
                        kv_budget_gib=16.0, check_every=10))
    assert res.violations == []
    assert res.summary["prefix_hit_ratio"] > 0.01  # first seconds: the cache is still cold
    # A 128-token window model: the ratchet has released the window before
    # every shared block boundary by the time the turn ends -> no usable hit.
    res = run(RunConfig(trace="mooncake_conversation", trace_end_s=15.0, model="gpt-oss-20b",
                        kv_budget_gib=8.0, check_every=10))
    assert res.violations == [] and res.summary["prefix_hit_ratio"] == 0.0


def test_state_model_with_snapshots():
    res = run(RunConfig(trace="mooncake_conversation", trace_end_s=10.0, model="qwen3-next-80b-a3b",
                        kv_budget_gib=16.0, check_every=10))
    assert res.violations == []
    assert res.summary["finished"] == res.summary["arrived"]


def test_write_run_outputs(tmp_path):
    res = run(RunConfig(**SMALL))
    out = write_run(res, tmp_path / "r", "csv")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["identity"]["model"] == "gpt-oss-20b"
    assert {"git_revision", "unikv_version", "scheduler", "seed", "kv_budget_bytes"} <= set(summary["identity"])
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == res.summary["steps"]


@pytest.mark.parametrize("change, needle", [
    (dict(model="no-such-model"), "gpt-oss-20b"),
    (dict(layout="end_float_end"), "end_float_end"),
    (dict(kv_budget_gib=0.05), "raise kv_budget_gib"),
    (dict(trace="/nonexistent.csv"), "neither a file nor a bundled sample"),
])
def test_bad_input_gets_a_clear_error(change, needle):
    with pytest.raises(ValueError, match=needle):
        run(RunConfig(**{**SMALL, **change}))


def test_unknown_layout_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid layouts"):
        RunConfig(layout="ring")


def test_rejected_requests_are_counted_when_asked():
    res = run(RunConfig(**{**SMALL, "kv_budget_gib": 0.05, "oversize": "reject"}))
    assert res.summary["rejected"] > 0


def test_oracle_admits_at_least_as_much_as_each_layout():
    cfg = RunConfig(trace="azure_conv", trace_end_s=30.0, model="gemma-3-12b", kv_budget_gib=2.0)
    oracle = run(cfg.with_(layout="oracle"))
    for layout in ("fixed_ratio", "end_end"):
        res = run(cfg.with_(layout=layout))
        assert oracle.summary["mean_running"] >= res.summary["mean_running"] * 0.999
        assert oracle.summary["sim_time_s"] <= res.summary["sim_time_s"] * 1.001


def test_replay_cli_writes_tables_summary_and_figures(tmp_path, capsys):
    code = replay(["--trace-end-s", "10", "--model", "gpt-oss-20b", "--kv-budget-gib", "1",
                   "--out", str(tmp_path), "--format", "csv"])
    assert code == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"steps.csv", "requests.csv", "summary.json", "config.json", "capacity_over_time.png",
            "frontiers.png", "compaction_cost.png"} <= names
    assert "capacity efficiency vs oracle" in capsys.readouterr().out


def test_replay_cli_reports_bad_input(capsys):
    assert replay(["--model", "nope"]) == 2
    assert "error:" in capsys.readouterr().err


def test_compare_cli_runs_the_grid(tmp_path):
    code = compare(["--trace-end-s", "8", "--model", "gpt-oss-20b", "--kv-budget-gib", "1",
                    "--out", str(tmp_path), "--format", "csv", "--compactions", "lazy", "eager"])
    assert code == 0
    table = pd.read_csv(tmp_path / "comparison.csv")
    # each engine baseline with the unified layout and the oracle under its rules
    assert set(table["label"]) == {"sglang", "end_end/lazy@sglang", "end_end/eager@sglang", "oracle@sglang",
                                   "vllm", "end_end/lazy@vllm", "end_end/eager@vllm", "oracle@vllm"}
    assert set(table["engine"]) == {"sglang", "vllm"}
    assert (table.loc[table["label"] == "oracle", "capacity_efficiency"] == 1.0).all()


def test_compare_shows_the_four_layouts_side_by_side(tmp_path):
    """A 2-kind and a 3-kind model on one real trace: sglang (for the model
    SGLang deploys), end_end, end_float_end and the oracle in one table, each
    scored against its own model's oracle."""
    code = compare(["--trace-end-s", "8", "--models", "gpt-oss-20b", "hymba-1.5b-base", "--kv-budget-gib", "1",
                    "--out", str(tmp_path), "--format", "csv", "--compactions", "lazy"])
    assert code == 0
    table = pd.read_csv(tmp_path / "comparison.csv")
    assert set(table["layout"]) == {"sglang", "end_end", "end_float_end", "vllm", "oracle"}
    assert set(table.loc[table["layout"] == "end_float_end", "model"]) == {"hymba-1.5b-base"}
    assert (table.loc[table["layout"] == "oracle", "capacity_efficiency"] == 1.0).all()
    assert (tmp_path / "hymba-1.5b-base" / "end_float_end_lazy").is_dir()


def _one_request(prompt: int, output: int) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [prompt], "output_tokens": [output]})


def test_request_limit_boundary_by_hand():
    # llama-3.1-8b: one full band, 131072 B/token, pages of 16 tokens = 2 MiB;
    # the sink is one page. 1000 + 8 tokens = 63 pages: 64 pages = 0.125 GiB
    # hold it; one page less cannot, and the run refuses to start.
    df = _one_request(1000, 8)
    cfg = RunConfig(trace="one", model="llama-3.1-8b", kv_budget_gib=0.125, check_every=1)
    res = run(cfg, trace_df=df)
    assert res.summary["finished"] == 1 and res.summary["retractions"] == 0 and res.violations == []
    assert res.summary["max_request_tokens"] == 1008
    with pytest.raises(RequestTooLargeError, match="holds at most 992 tokens.*raise kv_budget_gib"):
        run(cfg.with_(kv_budget_gib=(64 - 1) * 2**21 / 2**30), trace_df=df)


@pytest.mark.parametrize("layout", ["end_end", "fixed_ratio"])
def test_check_fits_and_the_engine_agree_at_the_boundary(layout):
    # A byte budget where check_fits starts to accept one gemma-3-12b request
    # (window band + full band, chunked prefill): the engine runs it there,
    # and a byte less stops the run before it starts. (The static split's
    # fit is not monotone in bytes: its regions' page alignment moves.)
    df = _one_request(20000, 200)
    plan_at = lambda b: build_layout(load_model("gemma-3-12b"), kv_budget_gib=b / 2**30,  # noqa: E731
                                     page_size=16, kind=layout)

    def fits(b: int) -> bool:
        try:
            check_fits(plan_at(b), 20200, prefill_chunk_tokens=8192)
        except ValueError:
            return False
        return True

    lo, hi = 1 << 20, 1 << 36
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    cfg = RunConfig(trace="one", model="gemma-3-12b", layout=layout, kv_budget_gib=hi / 2**30, check_every=1)
    res = run(cfg, trace_df=df)
    assert res.summary["finished"] == 1 and res.summary["retractions"] == 0 and res.violations == []
    with pytest.raises(RequestTooLargeError, match="raise kv_budget_gib"):
        run(cfg.with_(kv_budget_gib=(hi - 1) / 2**30), trace_df=df)


# -- trace options: one loader, seeded, CLI derived from RunConfig ---------------------------

def test_length_only_trace_gets_seeded_poisson_arrivals():
    cfg = RunConfig(trace="sharegpt_lengths", rate_rps=4.0, trace_end_s=20.0)
    df = load_trace(cfg)
    assert 40 <= len(df) <= 120  # ~80 expected
    assert df["arrival_s"].is_monotonic_increasing and 0 < df["arrival_s"].max() < 20.0
    pd.testing.assert_frame_equal(df, load_trace(cfg))
    assert not load_trace(cfg.with_(seed=1))["arrival_s"].equals(df["arrival_s"])
    with pytest.warns(traces.TraceWarning, match="no timestamps"):
        assert (load_trace(cfg.with_(rate_rps=None, trace_end_s=None))["arrival_s"] == 0).all()


def test_load_trace_spreads_clips_scales_and_caps_in_order():
    cfg = RunConfig(trace="mooncake_conversation", spread_s=3.0, trace_start_s=3.0, trace_end_s=30.0,
                    max_context_tokens=4096, rate_scale=2.0, max_requests=20)
    df = load_trace(cfg)
    assert len(df) == 20 and (df["prompt_tokens"] + df["output_tokens"]).max() <= 4096
    assert df["arrival_s"].nunique() > 10  # the 3 s buckets are spread
    history = " ".join(df.attrs["history"])
    for step in ("spread_buckets", "window", "clip_to_context", "scale_rate"):
        assert step in history
    assert history.index("window") < history.index("clip_to_context") < history.index("scale_rate")


def test_every_config_field_is_a_cli_flag_with_its_default(tmp_path):
    import argparse
    import dataclasses

    from unikv.sim.cli import _add_config_options, _config
    from unikv.sim.config import SchedulerConfig

    parser = argparse.ArgumentParser()
    _add_config_options(parser)
    args = parser.parse_args([])
    for cls, obj in ((RunConfig, RunConfig()), (SchedulerConfig, SchedulerConfig())):
        for f in dataclasses.fields(cls):
            if f.name != "scheduler":
                assert getattr(args, f.name) == getattr(obj, f.name), f.name
    cfg = _config(parser.parse_args(["--trace", "sharegpt_lengths", "--rate-rps", "3", "--trace-end-s",
                                     "none", "--max-context-tokens", "8192", "--no-prefix-cache"]))
    assert cfg.rate_rps == 3.0 and cfg.trace_end_s is None and cfg.max_context_tokens == 8192
    assert cfg.scheduler.prefix_cache is False


def test_replay_cli_poisson_arrivals_for_a_length_only_trace(tmp_path):
    code = replay(["--trace", "sharegpt_lengths", "--rate-rps", "2", "--trace-end-s", "5",
                   "--model", "gpt-oss-20b", "--kv-budget-gib", "1", "--out", str(tmp_path),
                   "--format", "csv", "--no-oracle", "--no-figures"])
    assert code == 0
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert requests["arrival_s"].nunique() == len(requests) > 1
    identity = json.loads((tmp_path / "summary.json").read_text())["identity"]
    assert identity["trace_slice"]["rate_rps"] == 2.0 and identity["trace_slice"]["seed"] == 0


def test_step_columns_are_consistent():
    """The engine writes step rows as tuples in column order: the chain-wide
    columns must equal the sums of the per-band ones, step by step."""
    res = run(RunConfig(**SMALL))
    steps = res.steps
    bands = [c[: -len("_live_bytes")] for c in steps.columns if c.endswith("_live_bytes") and c != "live_bytes"]
    assert bands == ["swa", "full"]
    for c in ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes"):
        assert (steps[c] == sum(steps[f"{b}_{c}"] for b in bands)).all(), c
    assert steps["step"].tolist() == list(range(1, len(steps) + 1))
    assert (steps["allocated_token_slots"] - steps["slack_tokens"] >= 0).all()
    assert (steps["prefill_tokens"] <= 8192).all() and steps["t_s"].is_monotonic_increasing
    assert steps["finished"].iloc[-1] == res.summary["finished"]


@pytest.mark.parametrize("layout", ["fixed_ratio", "end_float_end", "oracle"])
def test_a_three_kind_model_runs_on_every_layout_it_has(layout):
    """Hymba (full + swa + mamba): the end/float/end layout and its baselines
    replay a real slice with every page accounted for at every check."""
    res = run(RunConfig(trace="azure_conv", trace_end_s=15.0, model="hymba-1.5b-base", kv_budget_gib=0.5,
                        layout=layout, check_every=10))
    assert res.violations == []
    assert res.summary["finished"] == res.summary["arrived"] > 5


def test_meta_tokens_are_one_shared_copy_held_for_the_run():
    """128 meta tokens at page size 16: 8 pages on every token band, once."""
    from unikv.sim.memory import Memory

    from unikv.backends import SimBackend

    model = load_model("hymba-1.5b-base")
    plan = build_layout(model, kv_budget_gib=0.25, page_size=16, kind="end_float_end")
    pool = plan.make_pool(SimBackend(), "lazy")
    before = pool.available_size()
    mem = Memory(pool, window_tokens=model.window_tokens, block_tokens=None, meta_tokens=model.meta_tokens)
    assert len(mem.meta_pages) == 128 // 16 and pool.live_ids().tolist() == mem.meta_pages
    assert before - pool.available_size() >= 128
    assert mem.check([]) == []
    with pytest.raises(ValueError, match="cannot hold the model's 100000 meta tokens"):
        Memory(plan.make_pool(SimBackend(), "lazy"), window_tokens=model.window_tokens,
               block_tokens=None, meta_tokens=100_000)


def test_replay_pauses_the_cyclic_collector_and_restores_it():
    import gc

    from unikv.sim.run import gc_paused

    seen = []
    with gc_paused():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run(RunConfig(**SMALL))
        assert not gc.isenabled()  # a caller's own setting is kept
    finally:
        gc.enable()


@pytest.mark.parametrize("model", ["gemma-3-12b", "hymba-1.5b-base"])
def test_kv_read_from_totals_equals_the_walk(model):
    """The engine reads a whole running batch's KV bytes from totals."""
    import random

    from unikv.sim.models import load_model
    from unikv.sim.request import Request
    from unikv.sim.run import KVRead

    kv = KVRead(load_model(model))
    rng = random.Random(7)
    for n in (0, 1, 5, 40):
        batch = [Request(i, 0.0, 10, 10) for i in range(n)]
        for r in batch:
            r.seq = rng.randrange(0, 3 * max(kv.window, 64))
        seqs = [r.seq for r in batch]
        window = sum(min(s, kv.window) for s in seqs)
        assert kv.from_totals(n, sum(seqs), window) == kv(batch)
