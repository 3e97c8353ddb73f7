"""`run_study` on a local two-node Ray cluster: every run once, resume after
an interruption, failed and inapplicable runs recorded while the rest finish.

Ray starts once for the module (about 20 s of the ~30 s here)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from unikv.sim.study.dataset import VOLATILE, read_rows  # noqa: E402
from unikv.sim.study.runner import DATASET, ROWS, run_study  # noqa: E402
from unikv.sim.study.spec import parse_study  # noqa: E402

STUDY = parse_study({
    "study": {"name": "r"},
    "traces": [{"trace": "azure_conv", "window_s": [0.0, 15.0], "rate_scales": [1.0, 2.0]}],
    "models": {"names": ["gemma-3-12b"]},
    "budgets": [{"gib": 0.5}],
    "layouts": {"kinds": ["end_end", "oracle", "end_float_end"]},
    "objectives": {"ttft_p90_s": 2.0},
})
TOTAL = 6  # 2 rates x 3 layouts; end_float_end is inapplicable (gemma-3 has no mamba band)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
    yield c
    ray.shutdown()
    c.shutdown()


def _stable(rows: list[dict]) -> dict:
    return {r["run_id"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in rows}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    outcome = run_study(STUDY, out)
    return out, outcome


def test_every_run_runs_once_and_the_inapplicable_one_is_recorded(uninterrupted):
    out, outcome = uninterrupted
    assert (outcome.total, outcome.executed, outcome.skipped, outcome.remaining) == (TOTAL, TOTAL, 0, 0)
    rows = read_rows(out / ROWS)
    statuses = sorted(r["status"] for r in rows)
    assert statuses == ["inapplicable"] * 2 + ["ok"] * 4 and outcome.inapplicable == 2
    assert all("mamba" in r["reason"] for r in rows if r["status"] == "inapplicable")
    assert (out / DATASET).is_file()


def test_an_interrupted_study_resumes_with_only_the_missing_runs(uninterrupted, tmp_path):
    whole, _ = uninterrupted
    seen = []

    def stop_after_two(row: dict) -> None:
        seen.append(row["run_id"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(STUDY, tmp_path, on_row=stop_after_two)
    assert sorted(p.stem for p in (tmp_path / ROWS).glob("*.json")) == sorted(seen)
    ran = []
    outcome = run_study(STUDY, tmp_path, on_row=lambda row: ran.append(row["run_id"]))
    assert (outcome.executed, outcome.skipped, outcome.remaining) == (TOTAL - 2, 2, 0)
    assert not set(ran) & set(seen)
    assert _stable(read_rows(tmp_path / ROWS)) == _stable(read_rows(whole / ROWS))
    again = run_study(STUDY, tmp_path)
    assert (again.executed, again.skipped) == (0, TOTAL)


def test_max_runs_leaves_the_rest_for_later(tmp_path):
    outcome = run_study(STUDY, tmp_path, max_runs=1)
    assert (outcome.executed, outcome.remaining) == (1, TOTAL - 1)


def test_a_run_whose_worker_dies_is_a_failed_row_and_the_others_finish(tmp_path):
    from unikv.sim.study.execute import execute
    from unikv.sim.study.grid import expand
    from unikv.sim.study.runner import run_on_ray

    specs = [s for s in expand(STUDY) if s.columns["layout"] != "end_float_end"][:3]
    doomed = specs[1].run_id

    def work(spec):
        if spec.run_id == doomed:
            import os
            os._exit(1)  # as an out-of-memory kill would end the worker
        return execute(spec)

    assert run_on_ray(specs, tmp_path, None, work) == 3
    rows = {r["run_id"]: r for r in read_rows(tmp_path)}
    assert rows[doomed]["status"] == "failed" and "Worker" in rows[doomed]["reason"]
    assert [rows[s.run_id]["status"] for s in specs if s.run_id != doomed] == ["ok", "ok"]


SEARCH_STUDY = parse_study({
    "study": {"name": "s"},
    "traces": [{"trace": "azure_conv", "window_s": [0.0, 15.0], "rate_scales": [1.0]}],
    "models": {"names": ["gemma-3-12b"]},
    "budgets": [{"gib": 4.0}],
    "layouts": {"kinds": ["end_end", "oracle", "sglang"]},
    # met at 1x (TTFT p90 0.063 s with the bundled H200 profile), missed at 16x (0.256-0.257 s): a bisection
    "objectives": {"ttft_p90_s": 0.15},
    "search": {"rate_scale_lo": 0.5, "rate_scale_hi": 16.0, "rel_tol": 0.25},
})


def test_the_parallel_search_gives_the_serial_searchs_rows_and_a_rerun_runs_nothing(tmp_path):
    from unikv.sim.study.dataset import write_row
    from unikv.sim.study.execute import execute
    from unikv.sim.study.grid import expand
    from unikv.sim.study.runner import search_rates

    serial = tmp_path / "serial"
    specs = expand(SEARCH_STUDY)
    for spec in specs:
        write_row(serial, execute(spec))
    assert search_rates(SEARCH_STUDY, specs, serial, None, set()) > len(specs)  # the bisection ran points
    parallel = tmp_path / "parallel"
    outcome = run_study(SEARCH_STUDY, parallel)
    want, got = _stable(read_rows(serial)), _stable(read_rows(parallel / ROWS))
    assert got == want and outcome.executed == len(want)
    again = run_study(SEARCH_STUDY, parallel)
    assert again.executed == 0 and _stable(read_rows(parallel / ROWS)) == want
