"""The probe helpers themselves: they must tell a refusal from a run."""

import pytest
from cli_probe import Result, assert_complete_or_absent, assert_refused, run_cli


def test_a_bad_layout_is_refused_and_named(tmp_path):
    res = run_cli(["replay", "--layout", "nope", "--out", tmp_path / "run", "--quiet"])
    assert_refused(res, "layout", "nope")
    assert_complete_or_absent(tmp_path / "run")


def test_assert_refused_fails_on_success_traceback_or_a_vague_message():
    with pytest.raises(AssertionError):
        assert_refused(run_cli(["--version"]))
    with pytest.raises(AssertionError):
        assert_refused(Result(2, "", "Traceback (most recent call last):\nerror: x\n"))
    with pytest.raises(AssertionError):
        assert_refused(Result(2, "", "error: something went wrong\n"), "budget")


def test_assert_complete_or_absent_fails_on_a_partial_or_mixed_folder(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(AssertionError):
        assert_complete_or_absent(tmp_path)
    for name in ("steps.parquet", "requests.parquet", "config.json", "steps.csv"):
        (tmp_path / name).write_text("")
    with pytest.raises(AssertionError, match="other format"):
        assert_complete_or_absent(tmp_path)
