"""benchmarks/bench_flush_host.py: the move-overlap churn's host phases at
small sizes, the control's holes, and its refusals."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

FOLDER = Path(__file__).resolve().parents[3] / "benchmarks"
SMALL = ["--batch", "2", "--context", "2048", "--resident-tokens", "2048", "--move-cap", "32", "--warm", "1"]


@pytest.fixture
def bench(monkeypatch):
    """The script as a module; the move-overlap script it loads is undone after the test."""
    monkeypatch.delitem(sys.modules, "bench_move_overlap", raising=False)
    spec = importlib.util.spec_from_file_location("bench_flush_host", FOLDER / "bench_flush_host.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_flush_host", module)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_move_overlap", None)


def test_phases_are_timed_and_only_the_flushing_mode_moves(bench, capsys, one_thread):
    assert bench.main([*SMALL, "--steps", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mode | moves/step | decode us")
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines[1:]}
    assert float(rows["control"][1]) == 0 and float(rows["side-early"][1]) > 0
    for cells in rows.values():
        assert all(float(c.split()[0]) > 0 for c in cells[2:])  # every phase took some host time


def test_run_leaves_a_healthy_pool_and_reports_every_phase(bench, one_thread):
    import argparse

    args = argparse.Namespace(config=bench.FOLDER / "configs" / "gemma-3-12b-text_config.json", batch=2,
                              context=2048, residents=2, resident_tokens=2048, move_cap=32, steps=3, warm=1,
                              scale=64)
    row = bench.run(args, "side-early")  # raises if the pool's verify() finds a violation
    assert row["moves_per_step"] > 0
    assert set(row) == {"mode", "moves_per_step", *(f"{k}_us" for k in bench.PHASES),
                        *(f"{k}_p10_us" for k in bench.PHASES)}


@pytest.mark.parametrize(("argv", "message"), [
    (["--scale", "0"], "--scale=0 must be positive"),
    (["--scale", "7"], "--scale=7 does not divide band"),
    (["--context", "20"], "--context=20 must be a positive multiple of 16"),
])
def test_bad_sizes_are_refused_in_one_line(bench, capsys, argv, message):
    assert bench.main([*SMALL, "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
