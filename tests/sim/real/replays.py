"""A real-executor replay on the cost clock beside a cost-model replay,
through the CLI, for the tests that hold their tables equal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

PROBE = str(Path(__file__).resolve().parents[2] / "bad_input")  # cli_probe


def replay_args(model: Path, context: int, budget_gib: str, dtype: str = "fp32", *extra: str) -> list:
    """A small replay's arguments (no `--out`): the first 6 azure_conv
    requests clipped to `context` tokens, `model`'s config.json, KV in
    `dtype` within `budget_gib`, pages of 4 tokens, no oracle, no figures;
    `extra` options after them."""
    return ["replay", "--trace", "azure_conv", "--max-requests", "6", "--max-context-tokens", str(context),
            "--model", model, "--kv-cache-dtype", dtype, "--kv-budget-gib", budget_gib, "--page-size", "4",
            "--oversize", "reject", "--no-oracle", "--no-figures", "-q", *extra]


def real_and_cost_replays(tmp_path: Path, common: list, real_flags: list) -> tuple[dict, dict]:
    """`unikv` with `common` (a replay's arguments, no `--out`) and `real_flags`
    (`--executor real --real-clock cost`, ...) into `tmp_path / "real"`, and
    with `common` alone into `tmp_path / "cost"`. Asserts that both
    succeeded, that the real run wrote the usual files and that its steps
    and requests tables equal the cost run's, step for step; returns both
    runs' summary.json (real, cost)."""
    if PROBE not in sys.path:
        sys.path.insert(0, PROBE)
    from cli_probe import RUN_FILES, run_cli

    real = run_cli([*common, *real_flags, "--out", tmp_path / "real"])
    cost = run_cli([*common, "--out", tmp_path / "cost"])
    assert real.rc == 0 and cost.rc == 0, (real.stderr, cost.stderr)
    assert {p.name for p in (tmp_path / "real").iterdir()} == set(RUN_FILES["parquet"])
    for table in ("steps", "requests"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "real" / f"{table}.parquet"),
                                      pd.read_parquet(tmp_path / "cost" / f"{table}.parquet"))
    return (json.loads((tmp_path / "real" / "summary.json").read_text()),
            json.loads((tmp_path / "cost" / "summary.json").read_text()))
