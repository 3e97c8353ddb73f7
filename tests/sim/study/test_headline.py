"""The committed headline study asks what issue 18 item 5 asks of it (the file, not its results)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pydantic")
from unikv.sim.models import load_model  # noqa: E402
from unikv.sim.study.grid import expand  # noqa: E402
from unikv.sim.study.spec import load_study  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
STUDY = ROOT / "studies" / "headline.toml"
GIB = 1 << 30


@pytest.fixture(scope="module")
def grid():
    study = load_study(STUDY)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the study names config.json paths relative to the repository root
        return study, expand(study)


def _is_mla(name: str) -> bool:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return {k.name for k in load_model(name).token_kinds} == {"mla_latent"}


def test_four_whole_traces_and_the_five_layouts(grid):
    study, _ = grid
    assert len(study.traces) >= 4 and all(t.window_s is None for t in study.traces)
    assert set(study.layouts.kinds) >= {"sglang", "vllm", "end_end", "end_float_end", "oracle"}


def test_an_mla_model_fits_one_h200_and_runs_under_every_layout_that_applies(grid):
    study, specs = grid
    mla = [n for n in study.models.names if _is_mla(n)]
    runs = [s for s in specs if s.columns["model"] in mla and s.problem is None]
    assert runs, f"no MLA model of {mla} fits: {[s.problem for s in specs if s.columns['model'] in mla][:1]}"
    for run in runs:  # SGLang's rule: 0.88 x HBM - weights, and the weights leave room
        cols = run.columns
        assert cols["budget_rule"] == "sglang" and cols["kv_budget_bytes"] > 0
        assert cols["kv_budget_bytes"] == pytest.approx(0.88 * cols["hbm_capacity_bytes"] - cols["weight_bytes"],
                                                        abs=1)
    by_trace = {t.trace: {s.columns["layout"] for s in runs if s.columns["trace"] == t.trace} for t in study.traces}
    assert all(layouts >= {"sglang", "vllm", "end_end", "oracle"} for layouts in by_trace.values()), by_trace


def test_at_least_five_models_fit(grid):
    study, specs = grid
    fitting = {s.columns["model"] for s in specs if s.problem is None and s.columns["kv_budget_bytes"] > GIB}
    assert len(fitting) >= 5, sorted(fitting)
