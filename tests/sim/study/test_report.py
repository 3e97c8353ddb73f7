"""The study report from a small real dataset: short replays through
`unikv.sim.run` at several rates (no Ray), as rows with the study's columns
(docs/studies.md), then the report read from the Parquet file alone."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest
from unikv.sim import run as run_module
from unikv.sim.config import RunConfig
from unikv.sim.objectives import Objectives, evaluate
from unikv.sim.study import report
from unikv.sim.study import study_figures as figs

OBJECTIVES = {"ttft_p90_s": 0.3, "tpot_p90_s": 0.1}
SCALES = (4.0, 16.0, 32.0)
# The H200 spec by file, not by name: the replays keep the roofline, not the
# measured gpt-oss-20b profile (whose prefill this tiny budget grid was not sized for)
H200_FILE = str(Path(str(resources.files("unikv.sim").joinpath("data", "hardware", "h200.json"))))
BASE = dict(trace="azure_conv", trace_end_s=20.0, model="gpt-oss-20b", check_every=0, hardware=H200_FILE)


def _row(config: RunConfig, run_id: str) -> tuple[dict, pd.DataFrame]:
    """One dataset row (the study's identity, summary and objective columns) and the steps."""
    res = run_module.run(config)
    arrivals = res.requests["arrival_s"]
    service = evaluate(res.requests, Objectives.from_mapping(OBJECTIVES), res.summary["sim_time_s"])
    row = {"schema_version": 1, "run_id": run_id, "study": "tiny", "status": "ok", "reason": None,
           "trace": config.trace, "trace_start_s": 0.0, "trace_end_s": config.trace_end_s,
           "rate_scale": config.rate_scale, "offered_rate_rps": len(arrivals) / (arrivals.max() - arrivals.min()),
           "model": config.model, "kv_budget_gib": config.kv_budget_gib,
           "budget_rule": "explicit", "label": f"{config.layout}", "layout": config.layout,
           "compaction": config.compaction, "seed": config.seed, **res.summary, "gpu": "h200",
           "target_rate_rps": 2.0,  # as the study writes it: the asked rate, no objective
           **{f"target_{k}": v for k, v in OBJECTIVES.items()}, **service}
    return row, res.steps


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study folder: study.parquet, a study.toml, one kept steps table."""
    out = tmp_path_factory.mktemp("tiny")
    rows = []
    (out / report.STEPS).mkdir()
    runs = [(layout, 0.5, s) for layout in ("sglang", "vllm", "end_end") for s in SCALES]
    runs += [("end_end", 0.25, 16.0), ("end_end", 1.0, 16.0)]
    for i, (layout, gib, scale) in enumerate(runs):
        row, steps = _row(RunConfig(**BASE, layout=layout, kv_budget_gib=gib, rate_scale=scale), f"r{i:02d}")
        rows.append(row)
        if layout == "end_end" and gib == 0.5:
            steps.to_parquet(out / report.STEPS / f"{row['run_id']}.parquet")
    rows.append({**rows[0], "run_id": "bad", "status": "failed", "reason": "boom",
                 **{k: None for k in ("objectives_met", "goodput_rps", "objective_attainment")}})
    pd.DataFrame(rows).to_parquet(out / report.DATASET)
    (out / "study.toml").write_text('[study]\nname = "tiny"\n')
    return out


def test_report_from_the_dataset_alone(study, monkeypatch):
    def no_replay(*args, **kwargs):
        raise AssertionError("the report replayed a run")

    titles = []
    draw = figs._save

    def record(fig, path):  # every figure's titles, then the real save
        titles.append(" ".join([fig._suptitle.get_text() if fig._suptitle else ""] +
                               [ax.get_title() for ax in fig.axes]))
        return draw(fig, path)

    monkeypatch.setattr(run_module, "run", no_replay)
    monkeypatch.setattr(figs, "_save", record)
    monkeypatch.setattr(figs.run_figures, "_save", record)
    path = report.main(study / "study.toml", study)
    text = path.read_text()
    assert "## azure_conv [0-20 s] \\| gpt-oss-20b" not in text  # headings are not table cells
    assert "## azure_conv [0-20 s] | gpt-oss-20b | h200 | 0.5 GiB KV" in text
    assert "## azure_conv [0-20 s] | gpt-oss-20b | h200 | 0.25 GiB KV" in text
    assert "Objectives: tpot_p90_s <= 0.1, ttft_p90_s <= 0.3." in text
    assert "## Runs that did not finish" in text and "boom" in text
    assert "## Capacity over time" in text and "No per-step table" not in text
    figures = sorted(p.name for p in (study / report.FIGURES).iterdir())
    assert {"g00_latency.png", "g00_attainment.png", "g00_max_rate.png"} <= set(figures)
    assert any(f.startswith("capacity_r") for f in figures)
    assert all((study / report.FIGURES / f).stat().st_size > 1000 for f in figures)
    for name in figures:
        assert f"]({report.FIGURES}/{name})" in text
    table = pd.read_parquet(study / report.ANSWERS)
    assert len(table) == 3 + 2 and set(table["kv_budget_gib"]) == {0.25, 0.5, 1.0}
    row = table[(table["label"] == "end_end") & (table["kv_budget_gib"] == 0.5)].iloc[0]
    assert row["baseline"] in ("sglang", "vllm") and row["monotone"]
    base = table[(table["label"] == row["baseline"]) & (table["kv_budget_gib"] == 0.5)].iloc[0]
    assert row["gain"] == pytest.approx(row["max_rate_scale"] / base["max_rate_scale"])
    assert len(titles) == len(figures) == 3 * 3 + 1  # three budget groups, one capacity figure
    for text in titles:
        assert all(part in text for part in ("azure_conv", "gpt-oss-20b", "h200", "GiB KV")), text


def test_reported_maximum_rate_is_bracketed_by_the_rows(study):
    rows = report.served(pd.read_parquet(study / report.DATASET))
    assert "bad" not in set(rows["run_id"])
    key, part = next((k, p) for k, p in report.groups(rows) if k["kv_budget_gib"] == 0.5)
    answers = report.label_answers(part).set_index("label")
    assert set(answers.index) == {"sglang", "vllm", "end_end"}
    for label, a in answers.iterrows():
        mine = part[part["label"] == label].set_index("rate_scale")["objectives_met"]
        if a["outcome"] != "none":
            assert mine[a["value"]]  # the reported rate met the objectives ...
            assert all(mine[mine.index <= a["value"]])  # ... and so did every rate below it
        if a["outcome"] != "all":
            assert not mine[a["miss"]] and a["miss"] > (a["value"] or 0)
        if a["value"] is not None:  # req/s = scale x the offered rate per unit scale
            per_scale = (part["offered_rate_rps"] / part["rate_scale"]).median()
            assert a["value_rps"] == pytest.approx(a["value"] * per_scale)


def test_budget_answer_is_the_smallest_budget_that_met(study):
    rows = report.served(pd.read_parquet(study / report.DATASET))
    budgets = report.budget_answers(rows)
    cell = budgets[(budgets["label"] == "end_end")].iloc[0]
    at16 = rows[(rows["label"] == "end_end") & (rows["rate_scale"] == 16.0)].set_index("kv_budget_gib")
    met = at16["objectives_met"]
    assert cell["budgets"] == 3
    if cell["outcome"] == "none":
        assert not met.any()
    else:
        assert met[cell["min_budget_gib"]] and met[met.index >= cell["min_budget_gib"]].all()


def test_no_objectives_and_no_dataset_are_refused(study, tmp_path):
    df = pd.read_parquet(study / report.DATASET).drop(columns=["objectives_met"])
    with pytest.raises(ValueError, match="lacks column\\(s\\) objectives_met \\(give the study an"):
        report.write_report(df, tmp_path)
    with pytest.raises(FileNotFoundError, match="no study dataset at"):
        report.main(study / "study.toml", tmp_path)
    (tmp_path / "nameless.toml").write_text("[study]\n")
    with pytest.raises(ValueError, match="study.name=None"):
        report.study_dir_of(tmp_path / "nameless.toml")


def test_title_names_the_window_and_the_derived_budget():
    key = {"trace": "/data/conv.csv", "trace_start_s": 60.0, "trace_end_s": math.nan, "model": "m",
           "gpu": "h200", "kv_budget_gib": 98.25, "budget_rule": "sglang"}
    assert report.title(key) == "conv.csv [60-end s] | m | h200 | 98.2 GiB KV (sglang)"


def test_unified_gain_is_over_either_engines_baseline_and_its_own():
    """Rows as the study writes them: unified layouts once per engine's rules (sched_engine)."""
    met = {"sglang": 2.0, "vllm": 4.0, "end_end/lazy@sglang": 8.0, "end_end/lazy@vllm": 4.0}
    layout = {"sglang": "sglang", "vllm": "vllm", "end_end/lazy@sglang": "end_end", "end_end/lazy@vllm": "end_end"}
    rows = pd.DataFrame([{"label": lb, "layout": layout[lb], "sched_engine": lb.split("@")[-1],
                          "sched_max_running": 256, "model": "m", "rate_scale": s, "objectives_met": s <= met[lb],
                          "goodput_rps": s, "objective_attainment": 1.0}
                         for lb in met for s in (1.0, 2.0, 4.0, 8.0, 16.0)])
    (key, group), = report.groups(rows)  # one group: the engine is a series, not a group key
    assert "sched_engine" not in key and key["sched_max_running"] == 256
    gains, notes = report.gain_notes(report.label_answers(group))
    g = gains.set_index("layout")
    assert g.loc["end_end/lazy@sglang", "baseline"] == "vllm"  # the best of either engine
    assert g.loc["end_end/lazy@sglang", "gain"] == 2.0 and g.loc["end_end/lazy@sglang", "same_rules_gain"] == 4.0
    assert g.loc["end_end/lazy@vllm", "gain"] == 1.0
    assert notes["end_end/lazy@sglang"] == "x2.00 [1, 4] vs vllm; x4.00 vs sglang"


def test_no_gain_is_claimed_where_no_layout_met_the_objectives():
    rows = pd.DataFrame([{"label": lb, "layout": lb, "rate_scale": s, "objectives_met": False,
                          "goodput_rps": 0.0, "objective_attainment": 0.1}
                         for lb in ("sglang", "end_end") for s in (1.0, 2.0)])
    gains, notes = report.gain_notes(report.label_answers(rows))
    assert notes == {"end_end": "n/a: neither it nor sglang met the objectives at any rate run"}
    assert math.isnan(gains["gain"].iloc[0])


def test_a_long_title_is_wrapped_inside_its_figure(study, monkeypatch, tmp_path):
    # A model named by a config.json path makes a title wider than the figure; every
    # title line must still be drawn inside it (matplotlib clips a title it does not wrap).
    rows = report.served(pd.read_parquet(study / report.DATASET))
    _, part = next(iter(report.groups(rows)))
    title = "mooncake_conversation_whole | tests/data/configs/deepseek-ai--DeepSeek-V2-Lite-Chat_config.json" \
            " | h200 | 94.8 GiB KV (sglang)"
    overflow = []

    def check(fig, path):
        fig.canvas.draw()
        box = fig.bbox
        texts = ([fig._suptitle] if fig._suptitle else []) + [ax.title for ax in fig.axes]
        for text in (t for t in texts if t.get_text()):
            ext = text.get_window_extent()
            if ext.x0 < box.x0 - 1 or ext.x1 > box.x1 + 1:
                overflow.append(text.get_text())
        figs.plt.close(fig)
        return path

    monkeypatch.setattr(figs, "_save", check)
    kw = dict(x="offered_rate_rps", x_label="rate", title=title)
    figs.latency_vs_rate(part, path=tmp_path / "l.png", **kw)
    figs.attainment_vs_rate(part, path=tmp_path / "a.png", **kw)
    answers = report.label_answers(part)
    figs.max_rate_bars(answers, {}, y_label="max rate", title=title, path=tmp_path / "m.png")
    assert overflow == []
