"""Bad input, area "study files": `unikv study run` refuses a bad study file
with one line naming the file and the field path, runs nothing, and writes
no output folder."""

from __future__ import annotations

import pytest
from cli_probe import assert_refused, run_cli

GOOD = """
[study]
name = "bad"
[[traces]]
trace = "azure_conv"
window_s = [0.0, 10.0]
[models]
names = ["gemma-3-12b"]
[[budgets]]
gib = 0.5
[layouts]
kinds = ["oracle"]
"""

# (case id, text replaced, replacement, words the error names)
CASES = [
    ("unknown-key", 'name = "bad"', 'name = "bad"\ncolour = "red"', ["study.colour", "unknown key"]),
    ("unknown-table", "[models]", "[model]", ["model", "unknown key"]),
    ("bad-layout", 'kinds = ["oracle"]', 'kinds = ["static"]', ["layouts.kinds[0]", "static"]),
    ("zero-budget", "gib = 0.5", "gib = 0", ["budgets[0].gib", "greater than 0"]),
    ("two-budget-forms", "gib = 0.5", 'gib = 0.5\nderive = "vllm"', ["budgets[0]", "exactly one"]),
    ("reversed-window", "window_s = [0.0, 10.0]", "window_s = [10.0, 5.0]", ["traces[0]", "start must be < end"]),
    ("both-rate-forms", "window_s = [0.0, 10.0]", "rate_scales = [1.0]\nrates_rps = [2.0]",
     ["traces[0]", "rate_scales or rates_rps"]),
    ("unknown-objective", "[layouts]", "[objectives]\nttft_90 = 2.0\n[layouts]", ["objectives.ttft_90"]),
    ("bad-scheduler", "[layouts]", "[scheduler]\nmax_running = 0\n[layouts]", ["scheduler.max_running"]),
    ("bad-name", 'name = "bad"', 'name = "../up"', ["study.name"]),
    ("not-toml", "[models]", "[models", ["not a valid TOML file"]),
    ("unknown-trace", 'trace = "azure_conv"', 'trace = "no_such_trace"', ["no_such_trace"]),
    ("unknown-model", '"gemma-3-12b"', '"no-such-model"', ["no-such-model"]),
]


@pytest.mark.parametrize(("text", "new", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_study_file_is_refused_naming_the_field(tmp_path, text, new, words):
    assert text in GOOD
    path = tmp_path / "study.toml"
    path.write_text(GOOD.replace(text, new, 1))
    out = tmp_path / "out"
    result = run_cli(["study", "run", path, "--out", out, "-q"])
    assert_refused(result, *words)
    assert not out.exists()


def test_a_missing_study_file_is_named(tmp_path):
    assert_refused(run_cli(["study", "run", tmp_path / "none.toml"]), "none.toml", "no such file")


def test_max_runs_below_one_is_refused(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text(GOOD)
    assert_refused(run_cli(["study", "run", path, "--max-runs", "0"]), "--max-runs", "0")


def test_out_naming_a_file_is_refused(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text(GOOD)
    (tmp_path / "taken").write_text("x")
    assert_refused(run_cli(["study", "run", path, "--out", tmp_path / "taken"]), "--out", "taken", "folder")
