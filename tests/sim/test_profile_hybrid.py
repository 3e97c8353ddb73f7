"""A smoke profile of a tiny Nemotron-H hybrid (Mamba-2 + attention), made by
benchmarks/profile_model.py on the CPU, loads and is what a replay of that model uses.

The model is Nemotron-H-56B's config trimmed to 4 layers (mamba, attention,
mamba, MLP), hidden 64, random weights, bf16 on the CPU (unikv sizes conv
state in 2 bytes, which the executor's state band must equal). The script
runs every point as the real executor runs a model with recurrent state
(each chunk alone, the decoders as one `[B, 1]` step through the decode
graphs' bucket, the state gathered from and scattered to the pool's state
slots around each forward, inside the bucket for the decoders) and writes a
`"step_forwards": "per_chunk"` profile; a cost-model replay of the same
config on the h200 then prices its steps from it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim import profile as profile_mod  # noqa: E402
from unikv.sim.config import RunConfig, SchedulerConfig  # noqa: E402
from unikv.sim.profile import StepProfile  # noqa: E402
from unikv.sim.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "data" / "configs" / "nvidia--Nemotron-H-56B-Base-8K_config.json"
TRIM = {"hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
        "conv_kernel": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_head_dim": 16,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "chunk_size": 8,
        "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4, "time_step_rank": 8,
        "initializer_range": 0.1, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
NAME = "nemotron_h_tiny"  # the model name a replay of <NAME>/config.json takes (its folder's)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """(the config, the profiles folder) after one smoke run of the script."""
    root = tmp_path_factory.mktemp("hybrid_profile")
    config = root / NAME / "config.json"
    config.parent.mkdir()
    raw = json.loads(SOURCE.read_text()) | TRIM
    raw.pop("auto_map", None)
    config.write_text(json.dumps(raw))
    profiles = root / "profiles"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_model.py"), "--model", NAME, "--gpu", "h200",
         "--smoke", str(config), "--reps", "1", "--out", str(profiles / f"{NAME}__h200.json"),
         "--heldout", str(root / "heldout.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return config, profiles, root / "heldout.json", done.stdout


def test_the_smoke_profile_is_written_per_chunk_and_loads(smoke):
    _, profiles, heldout, log = smoke
    fit, held = StepProfile.load(profiles / f"{NAME}__h200.json"), StepProfile.load(heldout)
    for prof in (fit, held):
        assert (prof.model, prof.gpu, prof.step_forwards) == (NAME, "h200", "per_chunk")
        # decode points through the buckets' graphs, the state bound inside them (uncaptured on the CPU);
        # the CPU's calibration replay decodes eagerly (decode_graphs only on CUDA)
        assert "DecodeGraphs with the StateBinder" in prof.provenance["method"]
        assert "no prefix cache, eager decode" in prof.provenance["non_forward_method"]
        assert prof.non_forward_s > 0 and "decode-only steps None" not in prof.provenance["non_forward_method"]
    assert fit.prefill.rows == (16, 32) and fit.decode.cols == (16, 40) and held.mixed.rows == (24, 48)
    # a continuing chunk's own column, one page in (the held-out grid has no first chunks)
    assert fit.prefill.cols == (0, 16, 24) and fit.continuing_cached_tokens == 16
    assert held.continuing_cached_tokens is None
    assert all(t > 0 for grid in (fit.prefill, fit.decode, fit.mixed) for row in grid.forward_s for t in row)
    assert log.count(" ms (reps ") == 14 + 12  # every point of both files measured
    accuracy = importlib.util.spec_from_file_location("profile_accuracy", ROOT / "benchmarks" / "profile_accuracy.py")
    module = importlib.util.module_from_spec(accuracy)
    accuracy.loader.exec_module(module)
    assert [r["points"] for r in module.accuracy_rows(fit, held)] == [4, 4, 4, 12]


def test_a_replay_of_the_hybrid_uses_its_profile_and_says_so(smoke, monkeypatch, tmp_path):
    config, profiles, _, _ = smoke
    settings = dict(model=str(config), trace="mooncake_synthetic", max_requests=12, max_context_tokens=96,
                    kv_budget_gib=0.05, trace_end_s=None, gpu="h200",
                    scheduler=SchedulerConfig(prefix_cache=False, prefill_tokens_per_step=64))
    roofline = run(RunConfig(**settings)).summary
    real = profile_mod.profile_path
    monkeypatch.setattr(profile_mod, "profile_path", lambda m, g, d=None: real(m, g, profiles))
    per_chunk = run(RunConfig(**settings)).summary
    assert roofline["step_time_model"] == "roofline"
    assert per_chunk["step_time_model"] == f"profile:{NAME}__h200.json"
    # the same measurements read as one packed forward a step: steps of several chunks cost otherwise
    packed = json.loads((profiles / f"{NAME}__h200.json").read_text())
    packed.pop("step_forwards")
    packed.pop("continuing_cached_tokens")  # a packed step's chunks run on one path
    (tmp_path / f"{NAME}__h200.json").write_text(json.dumps(packed))
    monkeypatch.setattr(profile_mod, "profile_path", lambda m, g, d=None: real(m, g, tmp_path))
    merged = run(RunConfig(**settings)).summary
    assert merged["step_time_model"] == per_chunk["step_time_model"]
    assert len({roofline["busy_time_s"], per_chunk["busy_time_s"], merged["busy_time_s"]}) == 3


@pytest.fixture(scope="module")
def smoke_graphs(smoke, tmp_path_factory):
    """(the profile, its held-out file, stdout) of a smoke run with
    --prefill-graphs: each chunk through its token bucket, padded
    (`sim.real.padded_chunk`)."""
    config, _, _, _ = smoke
    root = tmp_path_factory.mktemp("hybrid_profile_graphs")
    out, held = root / f"{NAME}__h200.json", root / "heldout.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_model.py"), "--model", NAME, "--gpu", "h200",
         "--smoke", str(config), "--reps", "1", "--prefill-graphs", "--out", str(out), "--heldout", str(held)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return StepProfile.load(out), StepProfile.load(held), done.stdout


def test_a_smoke_profile_with_prefill_graphs_pads_each_chunk_and_loads(smoke_graphs):
    """The hybrid's chunks run through `PackedGraphs` with the state binder:
    the profile is per chunk and lists the buckets, which `StepProfile`
    reads chunk by chunk (`_mixed_chunk`); the method says how."""
    from unikv.sim.real.packed_graphs import PACKED_BUCKETS

    fit, held, log = smoke_graphs
    for prof in (fit, held):
        assert prof.step_forwards == "per_chunk" and prof.packed_buckets == tuple(PACKED_BUCKETS)
        assert "PackedGraphs with the StateBinder" in prof.provenance["method"]
        assert "sim.real.padded_chunk" in prof.provenance["method"]
    assert log.count(" ms (reps ") == 14 + 12  # the fit grid with its continuing column
    got, outside = fit.forward_s(chunk_tokens=20, cached_tokens=0, batch=2, context_tokens=32)
    assert got == pytest.approx(fit.mixed.forward_s[1][1], rel=1e-12) and not outside  # 20 pads to 32: its row
