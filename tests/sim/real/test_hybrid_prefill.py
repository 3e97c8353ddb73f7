"""A hybrid's prefill chunks through compiled layers (`CompiledLayers` over
Nemotron-H's blocks, `sim.real.hybrid`; `CompiledPrefill.forward_state`).

On the CPU the compile backend is "aot_eager" (dynamo and AOTAutograd
trace every block, no code generation), as in `test_prefill.py`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.graphs import CompiledLayers  # noqa: E402
from unikv.sim.real.hybrid import LayerCache, layer_kwargs  # noqa: E402

from tests.sim.real.test_hybrid_replay import BUDGETS, references, replay  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def compiled_replay(tmp_path, monkeypatch, name="nemotron_h", backend="aot_eager", chunk_size: int = 64,
                    device: str = "cpu"):
    """`test_hybrid_replay.replay` (lazy compaction) with the prefill chunks
    compiled by `backend`, the model's Mamba-2 scan in chunks of
    `chunk_size` tokens (64: every prefill chunk of 16 tokens or fewer is
    one scan chunk, which halves the graphs, and dynamo's tracing of a
    Mamba-2 block takes seconds on the CPU)."""
    from tests.sim.real import test_hybrid_replay

    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", backend)
    monkeypatch.setitem(test_hybrid_replay.TRIM, "chunk_size", chunk_size)
    return replay(tmp_path, monkeypatch, "lazy", name=name, budget_gib=BUDGETS.get(name, BUDGETS["nemotron_h"]),
                  compile_prefill=True, device=device)


@pytest.mark.parametrize("chunk_size,device,backend", [
    pytest.param(64, "cpu", "aot_eager", id="cpu-64"),
    pytest.param(8, "cuda", "inductor", id="cuda-8", marks=[CUDA, pytest.mark.gpu])])
def test_a_hybrid_replay_with_compiled_prefill_chunks_gives_transformers_tokens(tmp_path, monkeypatch, one_thread,
                                                                               chunk_size, device, backend):
    """Nemotron-H (mamba, attention, mamba, MLP): every prefill chunk (first
    chunks, continuing chunks, readmissions after a retraction) runs
    through the compiled blocks with the binder's cache; a handful of
    graphs serves every chunk size, and the tokens equal transformers'
    greedy `generate` (as the eager replay's do: test_hybrid_replay.py)."""
    torch._dynamo.reset()  # the graphs counted are this test's
    res, ex, retracted_at, continued = compiled_replay(tmp_path, monkeypatch, chunk_size=chunk_size, device=device,
                                                       backend=backend)
    s = res.summary
    chunks = int(res.steps["prefill_tokens"].gt(0).sum())
    assert res.violations == [] and continued and any(g > 0 for g in retracted_at)
    assert s["prefill_compile_failure"] is None and s["prefill_eager_steps"] == 0
    assert s["prefill_compiled_steps"] >= chunks  # a step's chunks run one forward each
    # graphs, whatever the chunk sizes: the attention and MLP blocks one each for many tokens and for one;
    # the Mamba-2 block a first chunk and a continuing one, each for one scan chunk or more, of a multiple of
    # the scan's chunk_size or not (the scan branches on both: ssd.chunk_scan, reshape_into_chunks), and a
    # continuing chunk of one token (transformers' one-token path); 9 at chunk_size 64 with torch 2.13 /
    # transformers 5.24 here, 11 with torch 2.11 / transformers 5.17 on the H200 (session_2026-12-02i)
    assert 5 <= s["prefill_graphs"] <= 2 + 2 + 2 * 4 + 1 + 1, s["prefill_graphs"]
    assert s["prefill_compiles"] * 3 < s["prefill_compiled_steps"]
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


def test_a_compile_that_fails_runs_the_chunks_eagerly_from_the_slots_state(tmp_path, monkeypatch, one_thread):
    """A backend that raises: the chunk that met it re-binds its state from
    the pool's slot and runs eagerly, as every later chunk does; the tokens
    are transformers' and the summary says why."""

    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    res, ex, _, _ = compiled_replay(tmp_path, monkeypatch, backend=broken)
    s = res.summary
    assert "this backend cannot compile" in s["prefill_compile_failure"]
    assert s["prefill_compiled_steps"] == 0 and s["prefill_eager_steps"] > 0
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


def test_the_layer_cache_answers_every_index_with_its_one_layer():
    """`LayerCache` is the transformers cache API of one layer, as 5.24
    (`get_conv_state`) and 5.17 (`has_previous_state`, `layers[i]`) read it."""
    from transformers.cache_utils import LinearAttentionLayer

    layer = LinearAttentionLayer()
    cache = LayerCache(layer, 7)
    assert cache.get_conv_state(3) is None and cache.get_recurrent_state(5) is None
    assert not cache.has_previous_state(2) and not cache.is_recording_past(2)
    full = cache.update_conv_state(torch.ones(1, 3, 2), 9, conv_kernel_size=4)
    assert full.shape == (1, 3, 4) and cache.has_previous_state(0)
    assert torch.equal(cache.get_conv_state(1), layer.conv_states[0]) and cache.layers[4] is layer
    cache.update_recurrent_state(torch.full((1, 2, 2), 3.0), 6)
    assert torch.equal(cache.get_recurrent_state(0), torch.full((1, 2, 2), 3.0)) and len(cache.layers) == 7


def test_layer_kwargs_leave_an_attention_only_forward_as_it_was():
    step = object()
    plain = {"use_cache": False, "unikv_step": step}
    assert layer_kwargs(plain, None, "attn") is plain
    cache = transformers.DynamicCache()
    cache.layers.append(object())
    assert layer_kwargs({"cache": cache, "unikv_step": step}, None, "attn") == {"unikv_step": step}
    assert layer_kwargs({"past_key_values": cache, "unikv_step": step}, None, None) == {}


def test_compiled_layers_refuse_a_model_without_attention_or_blocks():
    with pytest.raises(ValueError, match="nor a hybrid's blocks"):
        CompiledLayers(torch.nn.Linear(2, 2), backend="aot_eager", mode=None)


def test_recurrent_layers_share_their_graphs_when_the_mixer_indexes_the_cache_by_its_layer(
        tmp_path, monkeypatch, one_thread):
    """transformers 5.17's Mamba-2 mixer reads `cache_params.layers[self.
    layer_idx]`: an integer attribute of a module is a constant of dynamo's
    graphs, so that read made one graph per Mamba-2 layer on the H200 (past
    the recompile limit). `CompiledLayers.active` gives every recurrent
    module one index inside its block (each `LayerCache` still holds its
    own layer's state): with the read added to this transformers' mixer the
    graphs are as many as without it, and the tokens transformers'."""
    from transformers.models.nemotron_h import modeling_nemotron_h as module

    from tests.sim.real import test_hybrid_replay

    mixer = module.NemotronHMamba2Mixer
    forward = mixer.forward
    indices: set[int] = set()

    def reading(self, hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("cache_params"))
        if cache is not None:
            cache.layers[self.layer_idx]  # 5.17's read (modeling_nemotron_h.py, NemotronHMamba2Mixer.forward)
            if torch.compiler.is_compiling():
                indices.add(self.layer_idx)
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(mixer, "forward", reading)
    monkeypatch.setitem(test_hybrid_replay.TRIM, "hybrid_override_pattern", "M*MMM-")  # four Mamba-2 layers
    monkeypatch.setitem(test_hybrid_replay.TRIM, "num_hidden_layers", 6)
    monkeypatch.setitem(BUDGETS, "nemotron_h", 2 * BUDGETS["nemotron_h"])  # twice the state a request
    torch._dynamo.reset()
    res, ex, _, continued = compiled_replay(tmp_path, monkeypatch)
    s = res.summary
    assert continued and s["prefill_compile_failure"] is None and s["prefill_eager_steps"] == 0
    assert len(indices) == 1, indices  # one index inside the compiled blocks
    assert 5 <= s["prefill_graphs"] <= 9, s["prefill_graphs"]  # as with two Mamba-2 layers (cpu-64 above)
    assert {m.layer_idx for m in ex.model.modules() if isinstance(m, mixer)} == {0, 2, 3, 4}  # restored
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"
