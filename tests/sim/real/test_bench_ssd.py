"""benchmarks/bench_ssd.py: the mixer shapes it reads from a bundled
model's config and its refusals (the timings themselves are the device's:
results/real/h200/session_2026-12-02i/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(FOLDER))  # the script imports profile_coverage from its folder
    spec = importlib.util.spec_from_file_location("bench_ssd", FOLDER / "bench_ssd.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_ssd", module)
    spec.loader.exec_module(module)
    return module


def test_the_mixer_shapes_are_the_configs(bench):
    # (heads, head dim, groups, state, chunk): Nemotron-3-Nano's 64 x 64 heads over a 128-state, 8 groups
    assert bench.mixer_shape("nemotron-3-nano-30b-a3b") == (64, 64, 8, 128, 128)
    assert bench.mixer_shape("nemotron-h-56b") == (256, 64, 8, 256, 128)


@pytest.mark.parametrize("model, says", [
    ("llama-3.1-8b", "has no Mamba-2 mixer field"),
    ("no-such-model", "unknown model"),
])
def test_a_model_without_a_mixer_is_refused_naming_it(bench, model, says):
    with pytest.raises(ValueError, match=says) as err:
        bench.mixer_shape(model)
    assert model in str(err.value) and "\n" not in str(err.value)


def test_without_cuda_it_says_so_in_one_line(bench, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--tokens", "512"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bench_ssd.py times CUDA kernels") and err.count("\n") == 1
