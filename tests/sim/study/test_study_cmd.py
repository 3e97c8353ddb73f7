"""`unikv study run` end to end on a study whose runs are all known
inapplicable before they start (no Ray task): exit 3, one row each with
its reason, the dataset and the study file copied; a rerun skips them."""

from __future__ import annotations

import pandas as pd

from unikv.cli import main

STUDY = """
[study]
name = "nofit"
[[traces]]
trace = "azure_conv"
window_s = [0.0, 10.0]
[models]
names = ["llama-3.1-70b"]
[gpu]
name = "h200"
[[budgets]]
derive = "sglang"
[[budgets]]
derive = "vllm"
mem_fraction = 0.5
[layouts]
kinds = ["end_end", "oracle"]
"""


def test_runs_that_cannot_fit_are_recorded_and_the_command_says_so(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(STUDY)
    out = tmp_path / "out"
    assert main(["study", "run", str(path), "--out", str(out), "-q"]) == 3
    assert "4 runs: 4 run now, 0 already done, 0 failed, 4 inapplicable, 0 left" in capsys.readouterr().out
    df = pd.read_parquet(out / "study.parquet")
    assert sorted(df["budget_rule"]) == ["sglang", "sglang", "vllm", "vllm"]
    assert df["reason"].str.contains("does not fit").all()
    assert df["reason"].str.contains("131.4 GiB").all()  # the weights, named
    assert (out / "study.toml").read_text() == STUDY
    assert main(["study", "run", str(path), "--out", str(out), "-q"]) == 3
    assert "0 run now, 4 already done" in capsys.readouterr().out
