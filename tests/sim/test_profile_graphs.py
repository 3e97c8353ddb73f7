"""benchmarks/profile_model.py --prefill-graphs: a packed point runs
through the token buckets' graphs (`PackedGraphs`, uncaptured on the CPU)
as the executor's --prefill-graphs runs it, and a step past the largest
bucket runs as without, as the executor runs it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
TINY = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "sliding_window": 32, "sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
        "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(profile_model, the model, its spec, its placed layers), on the CPU in fp32."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        profile_model = importlib.import_module("profile_model")
        brd = importlib.import_module("bench_real_decode")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from unikv.sim.models import load_model
    from unikv.sim.real import attention, layers
    from unikv.sim.real import model as real_model

    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    before, threads = brd.DEVICE, torch.get_num_threads()
    brd.DEVICE = "cpu"
    torch.set_num_threads(1)  # on 2 shared cores more threads make tiny forwards slower
    lm = real_model.build_model(path, dtype="fp32", device="cpu", seed=0)
    lm.set_attn_implementation(attention.register(mask=False))
    yield profile_model, lm, load_model(str(path), kv_cache_dtype="fp32"), layers.model_layers(lm.config,
                                                                                               torch.float32)
    brd.DEVICE = before
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("chunk", "decoders", "through_graphs"), [(40, 0, True), (24, 3, True), (2100, 0, False)])
def test_a_packed_point_runs_through_the_buckets_up_to_the_largest(tiny, monkeypatch, chunk, decoders,
                                                                    through_graphs):
    from unikv.sim.real.packed_graphs import PackedGraphs

    profile_model, lm, spec, placed = tiny
    picks = []
    run = PackedGraphs.run

    def counting(self, batch):
        out = run(self, batch)
        picks.append(None if out is None else out.tolist())
        return out

    monkeypatch.setattr(PackedGraphs, "run", counting)
    times = profile_model.packed_point(lm, spec, placed, chunk, 0, decoders, 48 if decoders else 0, 2, graphs=True)
    assert len(times) == 2 and all(t > 0 for t in times)
    if through_graphs:  # every timed step (and the warm-ups) replayed a bucket, the picks of every request kept
        assert picks and all(p is not None and len(p) == decoders + 1 for p in picks)
    else:
        assert picks == []


def test_every_grid_the_script_measures_loads_as_a_padded_profile(tiny):
    """A profile measured with --prefill-graphs lists the buckets and is read
    at each step's bucket size; `StepProfile` refuses one whose rows pad to
    one bucket. The script's fitted, held-out and smoke grids all load."""
    from unikv.sim.profile import GRIDS, StepProfile
    from unikv.sim.real.packed_graphs import PACKED_BUCKETS

    profile_model = tiny[0]
    provenance = dict.fromkeys(("gpu_name", "driver", "torch", "triton", "date", "command", "git_revision"), "x")
    for grids in (profile_model.FIT, profile_model.HELDOUT, profile_model.SMOKE_FIT, profile_model.SMOKE_HELDOUT):
        data = {"format": "unikv-step-profile", "version": 1, "model": "m", "gpu": "h200", "provenance": provenance,
                "non_forward_s": 1e-3, "packed_buckets": list(PACKED_BUCKETS)}
        for name, (rows, cols) in grids.items():
            data[name] = {GRIDS[name][0]: rows, GRIDS[name][1]: cols,
                          "forward_s": [[1e-3 * (1 + r) * (1 + c) ** 0.1 for c in cols] for r in rows]}
        data["mixed"]["context_tokens"] = 2048
        prof = StepProfile.from_dict(data)
        assert prof.packed_buckets == PACKED_BUCKETS
    with pytest.raises(ValueError, match="two rows pad to one bucket"):
        StepProfile.from_dict(data | {"prefill": {**data["prefill"], "chunk_tokens": [17, 20]}})
