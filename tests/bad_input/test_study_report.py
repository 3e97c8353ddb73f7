"""`unikv study report` on bad input: refused with one line, nothing written."""

from __future__ import annotations

import pandas as pd
from cli_probe import assert_refused, run_cli


def _study(tmp_path, text='[study]\nname = "tiny"\n'):
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_no_dataset_in_the_folder(tmp_path):
    res = run_cli(["study", "report", _study(tmp_path), "--out", tmp_path / "nothing"])
    assert_refused(res, "no study dataset at", "nothing")
    assert not (tmp_path / "nothing").exists()


def test_a_dataset_without_objective_columns(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    pd.DataFrame({"label": ["sglang"], "layout": ["sglang"], "rate_scale": [1.0], "status": ["ok"]}) \
        .to_parquet(out / "study.parquet")
    res = run_cli(["study", "report", _study(tmp_path), "--out", out])
    assert_refused(res, "objectives_met", "[objectives]")
    assert sorted(p.name for p in out.iterdir()) == ["study.parquet"]


def test_a_study_file_without_a_name(tmp_path):
    assert_refused(run_cli(["study", "report", _study(tmp_path, "[study]\n")]), "study.name=None")


def test_a_study_file_that_is_not_toml(tmp_path):
    assert_refused(run_cli(["study", "report", _study(tmp_path, "[study\n")]), "study.toml", "not a TOML", "line 1")


def test_a_missing_study_file(tmp_path):
    assert_refused(run_cli(["study", "report", tmp_path / "absent.toml"]), "absent.toml")
