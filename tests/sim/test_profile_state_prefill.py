"""benchmarks/profile_state_prefill.py on the CPU: a tiny Nemotron-3-Nano
(Mamba-2, attention, Mamba-2, MoE; `test_hybrid_replay.config_file`) gives
the grouped table with every module kind it has, nonzero host times, and
the top-ops table, packed into one archive; bad input is refused in one
line with exit code 2.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from tests.sim.real.test_hybrid_replay import config_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "profile_state_prefill.py"
GROUPS = ("mamba2", "mamba2.in_proj", "mamba2.norm", "mamba2.out_proj", "attention", "moe.gate", "moe.experts",
          "moe.shared_experts", "state.gather", "state.scatter", "other")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """(stdout, the out folder) of one smoke run: a fresh chunk and one over
    8 cached tokens, each with two scans (the executor's: the kernels' torch
    reference on the CPU; transformers' own)."""
    root = tmp_path_factory.mktemp("state_prefill")
    out = root / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", str(config_file(root, "nemotron_moe")),
                           "--chunks", "16", "--cached", "0", "8", "--reps", "1", "--out", str(out), "--trace",
                           "--scans", "kernels", "transformers"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, out


def test_the_grouped_table_has_every_module_kind_with_time(smoke):
    stdout, out = smoke
    assert stdout.count("== prefill chunk 16 over ") == 4 and "top 20 ops and kernels by self CPU time" in stdout
    points = json.loads((out / "summary.json").read_text())["points"]
    assert [p["scan"] for p in points] == ["kernels", "transformers"] * 2
    assert stdout.count(", kernels scan: wall ") == stdout.count(", transformers scan: wall ") == 2
    fresh, cached = (p["groups"] for p in points[::2])
    assert "state.gather" not in fresh  # a first chunk starts from no state: nothing gathered
    for g in GROUPS:
        assert cached[g]["cpu_ms"] > 0 and cached[g]["ops"] > 0, g
        assert f"\n{g} " in stdout
    assert cached["moe.experts"]["syncs"] > 0  # the CPU's grouped_mm reads its offsets
    assert all(set(p["kinds"]) >= {"mamba2", "moe", "attention", "state", "other"} for p in points[2:])
    assert all(p["wall_ms"] > 0 and p["kernel_ms"] == 0 for p in points)  # no CUDA on the CPU


def test_everything_is_packed_into_one_archive(smoke):
    _, out = smoke
    with tarfile.open(out.with_name("out.tar.gz")) as t:
        names = sorted(t.getnames())
    assert names == [f"out/chunk16_cached{k}_{scan}.trace.json" for k in (0, 8) for scan in ("kernels", "transformers")
                     ] + ["out/report.txt", "out/summary.json"]
    assert sorted(f.name for f in out.iterdir()) == ["report.txt", "summary.json"]  # the traces only packed


def test_a_decode_point_groups_the_eager_decode_step(tmp_path):
    """--decode: a [B, 1] step of B requests at --context tokens, grouped
    like a chunk: with the kernels as the executor's bucket runs it (the
    Mamba-2 state updated in its slots: no gather or scatter), with
    transformers' update between the binder's gather and scatter."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", str(config_file(tmp_path, "nemotron_moe")),
                           "--chunks", "--decode", "3", "--context", "16", "--reps", "1", "--out", str(out),
                           "--scans", "kernels", "transformers"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("== decode batch 3 at 16 tokens, eager, kernel update in slot: wall ") == 1
    assert done.stdout.count("== decode batch 3 at 16 tokens, eager, transformers' update, gathered and "
                             "scattered: wall ") == 1
    assert "== prefill" not in done.stdout
    slot, gathered = json.loads((out / "summary.json").read_text())["points"]
    assert [(p["decode"], p["context"], p["scan"]) for p in (slot, gathered)] == [(3, 16, "kernels"),
                                                                                  (3, 16, "transformers")]
    for g in ("mamba2", "moe.experts", "attention"):
        assert slot["groups"][g]["cpu_ms"] > 0 and gathered["groups"][g]["cpu_ms"] > 0, g
    for g in ("state.gather", "state.scatter"):
        assert slot["groups"].get(g, {"cpu_ms": 0})["cpu_ms"] == 0, g
        assert gathered["groups"][g]["cpu_ms"] > 0, g


@pytest.mark.parametrize("argv, says", [
    (["--chunks", "512", "0"], "--chunks [512, 0]: every chunk must be a positive token count"),
    (["--model", "no-such-model"], "--model 'no-such-model': unknown model"),
    (["--model", "llama-3.1-8b"], "--model 'llama-3.1-8b': llama-3.1-8b keeps no recurrent state"),
    (["--smoke", str(ROOT / "tests/data/configs/meta-llama--Meta-Llama-3.1-8B_config.json")], "keeps no recurrent"),
    (["--reps", "0"], "--reps 0: must be positive"),
    (["--decode", "0"], "--decode [0] --context 4096: batches and the context must be positive"),
])
def test_bad_input_is_refused_in_one_line(argv, says, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    script = importlib.import_module("profile_state_prefill")
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err



def test_each_scan_swaps_in_its_own_function():
    """`scanning(scan)`: the executor's scan context (`scan_for` of a model
    with a Mamba-2 mixer) becomes the kernels', their reference's, or no
    swap (transformers' own), and is back after the block."""
    import contextlib
    import importlib.util

    from unikv.sim.real import ssd

    spec = importlib.util.spec_from_file_location("profile_state_prefill", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SCANS == ("kernels", "einsum", "transformers")
    own = ssd.kernel_chunk_scan
    for scan, want in (("kernels", own), ("einsum", ssd.einsum_chunk_scan), ("transformers", contextlib.nullcontext)):
        with module.scanning(scan):
            assert ssd.kernel_chunk_scan is want, scan
        assert ssd.kernel_chunk_scan is own
