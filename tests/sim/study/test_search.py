"""The rate search of `unikv study run` (`[search]`): each cell's rate scale
bisected for the highest one meeting the objectives, from the rows the grid
left, every point a content-addressed row (run directly, without Ray)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")
from unikv.sim.study.dataset import read_rows, write_row  # noqa: E402
from unikv.sim.study.execute import execute  # noqa: E402
from unikv.sim.study.grid import at_rate, expand, rate_group  # noqa: E402
from unikv.sim.study.runner import search_rates  # noqa: E402
from unikv.sim.study.spec import parse_study  # noqa: E402

STUDY = {"study": {"name": "s"},
         "traces": [{"trace": "azure_conv", "window_s": [0.0, 30.0], "rate_scales": [1.0]}],
         "models": {"names": ["gemma-3-12b"]}, "budgets": [{"gib": 4.0}],
         "layouts": {"kinds": ["end_end", "oracle"]}, "objectives": {"ttft_p90_s": 1.0},
         "search": {"rate_scale_lo": 0.5, "rate_scale_hi": 16.0, "rel_tol": 0.25}}


def test_a_point_of_the_grid_has_the_run_id_the_search_gives_it():
    study = parse_study(dict(STUDY, traces=[dict(STUDY["traces"][0], rate_scales=[1.0, 2.0])]))
    specs = expand(study)
    by_rate = {(s.columns["label"], s.columns["rate_scale"]): s for s in specs}
    for (label, rate), spec in by_rate.items():
        assert at_rate(spec, rate).run_id == spec.run_id
        other = by_rate[(label, 3.0 - rate)]
        assert at_rate(spec, 3.0 - rate).run_id == other.run_id and rate_group(spec) == rate_group(other)
    assert len({rate_group(s) for s in specs}) == 2  # one cell per layout


def test_the_search_brackets_each_cells_highest_rate_and_a_rerun_runs_nothing(tmp_path):
    study = parse_study(STUDY)
    specs = expand(study)
    for spec in specs:
        write_row(tmp_path, execute(spec))
    used: set[str] = set()
    executed = search_rates(study, specs, tmp_path, None, used)
    rows = [r for r in read_rows(tmp_path) if r["status"] == "ok"]
    assert executed == len(rows) - len(specs) > 0 and {r["run_id"] for r in rows} == used
    for label in ("end_end/lazy", "oracle"):
        points = sorted((r["rate_scale"], r["objectives_met"]) for r in rows if r["label"] == label)
        met = [x for x, ok in points if ok]
        missed = [x for x, ok in points if not ok]
        assert met and missed and max(met) < min(missed) <= max(met) * 1.25, points
    assert search_rates(study, specs, tmp_path, None, set()) == 0  # every point is a row now


def test_a_search_needs_objectives_and_an_increasing_range():
    with pytest.raises(ValueError, match="needs \\[objectives\\]"):
        parse_study({k: v for k, v in STUDY.items() if k != "objectives"})
    with pytest.raises(ValueError, match="rate_scale_lo"):
        parse_study(dict(STUDY, search={"rate_scale_lo": 4.0, "rate_scale_hi": 2.0}))


def test_a_cell_whose_layout_does_not_apply_is_not_searched(tmp_path):
    study = parse_study(dict(STUDY, layouts={"kinds": ["end_float_end"]}))  # gemma-3 has no mamba band
    specs = expand(study)
    for spec in specs:
        write_row(tmp_path, execute(spec))
    assert [r["status"] for r in read_rows(tmp_path)] == ["inapplicable"]
    assert search_rates(study, specs, tmp_path, None, set()) == 0 and len(read_rows(tmp_path)) == 1
