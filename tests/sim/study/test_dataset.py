"""The study dataset: row files, one Parquet file, read by pandas, polars and duckdb."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
from unikv.sim.study.dataset import COLUMNS, SCHEMA_VERSION, read_rows, table, write_dataset, write_row
from unikv.sim.study.execute import FAILED, OK, execute
from unikv.sim.study.grid import expand
from unikv.sim.study.spec import parse_study

STUDY = {"study": {"name": "d"}, "traces": [{"trace": "azure_conv", "window_s": [0.0, 15.0]}],
         "models": {"names": ["gemma-3-12b"]}, "budgets": [{"gib": 0.5}],
         "layouts": {"kinds": ["end_end", "oracle", "end_float_end"]},
         "objectives": {"ttft_p90_s": 2.0, "tpot_p90_s": 0.05}}


@pytest.fixture(scope="module")
def rows():
    return [execute(spec) for spec in expand(parse_study(STUDY))]


@pytest.fixture(scope="module")
def dataset(rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    for row in rows:
        write_row(out / "rows", row)
    return write_dataset(out / "study.parquet", read_rows(out / "rows"))


def test_rows_carry_status_identity_metrics_and_objectives(rows):
    by = {r["label"]: r for r in rows}
    assert by["end_float_end/lazy"]["status"] == "inapplicable"
    assert "no mamba band" in by["end_float_end/lazy"]["reason"]
    ok = by["end_end/lazy"]
    assert ok["status"] == OK and ok["reason"] is None and ok["arrived"] > 0
    assert ok["target_ttft_p90_s"] == 2.0 and 0 <= ok["objective_attainment"] <= 1
    assert ok["goodput_rps"] == pytest.approx(ok["met_requests"] / ok["sim_time_s"])
    assert ok["bands"] and ok["kv_budget_bytes"] == 1 << 29


def test_every_declared_column_in_order_then_the_objectives(dataset):
    schema = pq.read_schema(dataset)
    names = schema.names
    assert names[: len(COLUMNS)] == [n for n, _ in COLUMNS]
    assert set(names[len(COLUMNS):]) == {"target_ttft_p90_s", "target_tpot_p90_s", "objective_attainment",
                                         "met_requests", "goodput_rps", "objective_ttft_p90_s",
                                         "objective_tpot_p90_s", "objectives_met"}
    assert str(schema.field("objectives_met").type) == "bool"


def test_pandas_reads_it_with_capacity_efficiency_against_the_oracle(dataset):
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(dataset)
    assert len(df) == 3 and set(df["schema_version"]) == {SCHEMA_VERSION}
    oracle = df[df["layout"] == "oracle"].iloc[0]
    unified = df[df["label"] == "end_end/lazy"].iloc[0]
    assert oracle["capacity_efficiency"] == 1.0
    assert unified["capacity_efficiency"] == pytest.approx(unified["mean_running"] / oracle["mean_running"])
    assert math.isnan(df[df["status"] == "inapplicable"].iloc[0]["mean_running"])


def test_polars_reads_it(dataset):
    pl = pytest.importorskip("polars")
    df = pl.read_parquet(dataset)
    assert df.height == 3 and df.filter(pl.col("status") == "ok").height == 2
    assert df.schema["kv_budget_bytes"] == pl.Int64


def test_duckdb_reads_it(dataset):
    duckdb = pytest.importorskip("duckdb")
    got = duckdb.sql(f"select label, goodput_rps from '{dataset}' where status = 'ok' order by label").fetchall()
    assert [label for label, _ in got] == ["end_end/lazy", "oracle"]
    assert all(g > 0 for _, g in got)


def test_a_run_that_raises_is_recorded_failed_with_its_reason(monkeypatch):
    import unikv.sim.run as sim_run

    def broken(*args, **kwargs):
        raise RuntimeError("the replay broke")

    monkeypatch.setattr(sim_run, "run", broken)
    spec = next(s for s in expand(parse_study(STUDY)) if s.columns["label"] == "oracle")
    row = execute(spec)
    assert row["status"] == FAILED and row["reason"] == "RuntimeError: the replay broke"
    assert "mean_running" not in row
    assert table([row]).column("mean_running").null_count == 1


def test_a_row_file_is_written_whole_and_read_back(tmp_path, rows):
    path = write_row(tmp_path, rows[0])
    assert path.name == f"{rows[0]['run_id']}.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    assert read_rows(tmp_path) == [rows[0]]
