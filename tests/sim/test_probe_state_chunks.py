"""benchmarks/probe_state_chunks.py's arguments (its timings need the H200)."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("probe_state_chunks", ROOT / "benchmarks" / "probe_state_chunks.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_points_parse_and_bad_ones_are_named():
    assert probe.parse_point("4095:0") == (4095, 0)
    assert [probe.parse_point(p) for p in probe.POINTS][-1] == (8192, 8192)
    for bad in ("4096", "a:0", "0:0", "16:-1"):
        with pytest.raises(argparse.ArgumentTypeError, match=bad.replace("-", r"\-")):
            probe.parse_point(bad)


def test_a_model_without_state_is_refused_by_name(capsys, monkeypatch):
    monkeypatch.setattr(probe.brd, "DEVICE", probe.brd.DEVICE)  # --smoke sets it to the CPU: restored after
    config = ROOT / "tests" / "data" / "configs" / "Qwen--Qwen3-8B_config.json"
    assert probe.main(["--smoke", str(config)]) == 2
    assert "no recurrent state" in capsys.readouterr().err


def test_a_model_whose_chunks_cannot_run_padded_is_refused_by_name(capsys, monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import json

    from tests.sim.real.test_hybrid_replay import LFM2

    monkeypatch.setattr(probe.brd, "DEVICE", probe.brd.DEVICE)
    config = tmp_path / "lfm2" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LFM2))
    assert probe.main(["--smoke", str(config), "--points", "16:0"]) == 2
    assert "padded chunk path" in capsys.readouterr().err


def test_chunks_are_grouped_by_shape_largest_first():
    shapes = probe.by_shape([(4095, 0, 0.1), (8192, 228, 0.2), (4095, 0, 0.3)])
    assert list(shapes.items()) == [((8192, 228), [0.2]), ((4095, 0), [0.1, 0.3])]


def test_cells_are_refused_on_the_cpu_and_for_a_model_the_validation_does_not_run(capsys, monkeypatch):
    monkeypatch.setattr(probe.brd, "DEVICE", probe.brd.DEVICE)
    config = ROOT / "tests" / "data" / "configs" / "Qwen--Qwen3-8B_config.json"
    assert probe.main(["--smoke", str(config), "--cells", "azure_code"]) == 2
    assert "not with --smoke" in capsys.readouterr().err
    assert probe.main(["--model", "lfm2-1.2b", "--cells", "azure_code"]) == 2
    assert "not a validation model" in capsys.readouterr().err
