"""Packed (prefill and mixed) steps through compiled decoder layers
(`sim.real.prefill.CompiledPrefill`, `RunConfig.compile_prefill`).

On the CPU the compile backend is "aot_eager" (dynamo and AOTAutograd
trace and functionalise every layer, no code generation: inductor's C++
takes minutes on 2 cores); on CUDA it is inductor, as a run uses it.
"""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from unikv.sim.config import RunConfig, SchedulerConfig  # noqa: E402
from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.prefill import CompiledPrefill, sink_step  # noqa: E402
from unikv.sim.run import run  # noqa: E402

from tests.sim.real.test_executor import (  # noqa: E402
    assert_transformers_tokens,
    lockstep_build,
    model_config,
    trace,
    trimmed,
    warming,
)
from tests.sim.real.test_graphs import PS, pool_and_views  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = [pytest.param("cpu", "aot_eager", id="cpu-aot_eager"),
           # inductor's C++ code generation takes minutes on a 2-core CPU: slow there
           pytest.param("cpu", "inductor", id="cpu-inductor", marks=pytest.mark.slow),
           pytest.param("cuda", "inductor", id="cuda-inductor", marks=[CUDA, pytest.mark.gpu])]


def compiled_replay(tmp_path, monkeypatch, name: str, budget_gib: float, device: str, backend: str):
    """The executor tests' trace (prefix blocks, retractions, chunks of at
    most 48 tokens) with compiled decode graphs and compiled packed steps;
    returns (result, executor)."""
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(trimmed(name)))
    built = {}
    build = real_executor.build_real_executor
    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", backend)
    monkeypatch.setattr(real_executor, "build_real_executor", lambda *a, **k: built.setdefault("ex", build(*a, **k)))
    monkeypatch.setattr(real_executor, "build_batch", lockstep_build)
    config = RunConfig(trace="test", model=str(path), kv_cache_dtype="fp32", executor="real", real_clock="cost",
                       device=device, decode_graphs=True, compile_decode=True, compile_prefill=True,
                       kv_budget_gib=budget_gib, page_size=4, layout="end_end", compaction="lazy", check_every=1,
                       scheduler=SchedulerConfig(max_running=16, prefill_tokens_per_step=48, reserve_init=0.0,
                                                 reserve_min=0.0, reserve_decay=0.0))
    return run(config, trace_df=trace()), built["ex"]


@pytest.mark.parametrize("device,backend", DEVICES)
@pytest.mark.parametrize("name,budget_gib", [("gemma3", 0.00004), ("gpt_oss", 0.00003), ("llama", 0.00004)])
def test_a_replay_with_compiled_packed_steps_gives_transformers_greedy_tokens(tmp_path, monkeypatch, one_thread,
                                                                            name, budget_gib, device, backend):
    """Chunked prefills, mixed steps (chunks packed with decoders), window
    layers (Gemma-3, gpt-oss), prefix-cache hits (Llama: a window model's
    hits need the window still bound, not asked here), compaction and
    retractions (readmissions recompute their prompt): every packed step
    runs compiled, a handful of graphs serves every chunk size, and every
    request's tokens equal transformers' greedy run with its own cache."""
    res, ex = compiled_replay(tmp_path, monkeypatch, name, budget_gib, device, backend)
    steps, s = res.steps, res.summary
    packed = int((steps["prefill_tokens"] > 0).sum())
    assert ((steps["prefill_tokens"] > 0) & (steps["decode_tokens"] > 0)).sum() > 0, "no mixed step"
    assert (steps["prefill_tokens"] == 48).sum() > 0, "no step's chunks filled the chunk budget"
    assert s["retractions"] > 0 and steps["moves"].iloc[-1] > 0
    assert s["prefill_compile_failure"] is None
    if device == "cpu" or name != "gpt_oss":  # transformers' eager MoE may not be capturable on CUDA: it says why
        assert s["graph_compile_failures"] == {}
    assert s["prefill_compiled_steps"] == packed and s["prefill_eager_steps"] == 0
    # one graph per layer kind (Gemma-3, gpt-oss: window and full; Llama: one) for every step of
    # more than one token, one request or many (these replays have no one-token step)
    kinds = 1 if name == "llama" else 2
    assert s["prefill_compiles"] == 1 and s["prefill_graphs"] == kinds < packed
    if name == "llama":
        assert res.requests["hit_tokens"].sum() > 0, "no prefix-cache hit read another request's KV"
    assert res.violations == []
    assert_transformers_tokens(res, ex)


# -- CompiledPrefill on single packed steps --


def chunk_step(pool, views, tokens: int, seed: int):
    """One request's first chunk of `tokens` tokens, its pages allocated: `forward`'s arguments."""
    from unikv.sim.real.attention import StepContext

    vids = np.asarray(pool.alloc_extend(np.zeros(1, np.int64), np.array([tokens]), np.zeros(1, np.int64)))
    ctx = StepContext(views=views, block_tables={b: views.block_table([vids[::PS] // PS], b) for b in views.bands},
                      cu_q=torch.tensor([0, tokens], dtype=torch.int32),
                      seq_lens=torch.tensor([tokens], dtype=torch.int32),
                      write_slots={b: torch.as_tensor(pool.translate(vids, b)) for b in views.bands})
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, 96, (1, tokens)))
    return ctx, ids, torch.arange(tokens).view(1, tokens), torch.tensor([tokens - 1])


def test_one_compiled_graph_per_layer_kind_serves_every_chunk_size(gemma):
    """Chunks of 5, 9, 13 and 6 tokens (tables of 2 to 4 pages) share the
    graphs of the first (two: window and full layers); a one-token chunk (a
    table of one page) compiles its own. Logits equal the eager forward's
    over an identical pool, and the KV both wrote."""
    model, layers = gemma
    torch._dynamo.reset()  # the graphs counted are this test's, whatever ran before
    (pool_a, views_a), (pool_b, views_b) = pool_and_views(layers, pages=200), pool_and_views(layers, pages=200)
    eager = CompiledPrefill(model, views_a, device="cpu", backend="aot_eager")
    eager.failure = "the eager reference"  # a recorded failure: every step eagerly
    compiled = CompiledPrefill(model, views_b, device="cpu", backend="aot_eager")
    graphs = []
    for seed, tokens in enumerate((5, 9, 13, 1, 6)):
        want = eager.forward(*chunk_step(pool_a, views_a, tokens, seed)).logits
        got = compiled.forward(*chunk_step(pool_b, views_b, tokens, seed)).logits
        assert torch.equal(got, want), tokens
        graphs.append(compiled.stats()["graphs"])
    assert graphs == [2, 2, 2, 4, 4]
    assert np.array_equal(pool_a.buffer, pool_b.buffer)
    stats = compiled.stats()
    assert stats["compiled_steps"] == 5 and stats["eager_steps"] == 0 and stats["compiles"] == 2
    assert stats["failure"] is None and stats["compile_s"] > 0
    assert eager.stats()["compiled_steps"] == 0 and eager.stats()["eager_steps"] == 5
    for layer in model.model.layers:  # the model as it was: no compiled forward, no reference to the pool
        assert "forward" not in vars(layer) and not hasattr(layer.self_attn, "unikv_cache")
    # another CompiledPrefill over a pool of another size (a profile's next point) reuses the graphs
    pool_c, views_c = pool_and_views(layers, pages=150)
    again = CompiledPrefill(model, views_c, device="cpu", backend="aot_eager")
    again.forward(*chunk_step(pool_c, views_c, 11, 0))
    assert again.stats()["graphs"] == 0 and again.stats()["compiled_steps"] == 1


def test_a_compile_that_fails_is_recorded_and_the_steps_run_eagerly(gemma):
    """A backend that raises: the step that met it, and every later one, runs
    eagerly with the eager logits; the stats say why."""
    model, layers = gemma
    (pool_a, views_a), (pool_b, views_b) = pool_and_views(layers, pages=200), pool_and_views(layers, pages=200)

    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    eager = CompiledPrefill(model, views_a, device="cpu", backend="aot_eager")
    eager.failure = "the eager reference"
    failing = CompiledPrefill(model, views_b, device="cpu", backend=broken)
    for seed, tokens in enumerate((7, 10)):
        want = eager.forward(*chunk_step(pool_a, views_a, tokens, seed)).logits
        assert torch.equal(failing.forward(*chunk_step(pool_b, views_b, tokens, seed)).logits, want)
    stats = failing.stats()
    assert stats["compiled_steps"] == 0 and stats["eager_steps"] == 2 and stats["graphs"] == 0
    assert "this backend cannot compile" in stats["failure"]
    assert np.array_equal(pool_a.buffer, pool_b.buffer)


def test_the_warm_up_compiles_the_usual_shapes_and_writes_only_the_sink(gemma):
    model, layers = gemma
    torch._dynamo.reset()  # the graphs counted are this test's, whatever ran before
    pool, views = pool_and_views(layers, pages=200)
    before = pool.buffer.copy()
    compiled = CompiledPrefill(model, views, device="cpu", backend="aot_eager")
    compiled.warm_up(PS, views.bands)
    sink = pool.layout.sink_bytes
    assert (pool.buffer[sink:] == before[sink:]).all()
    stats = compiled.stats()
    # two layer kinds (window, full) for steps of many tokens and of one
    assert stats["compiled_steps"] == 2 and stats["failure"] is None and stats["graphs"] == 4
    # then no step compiles: one request or several, any table width, any token count
    compiled.forward(*chunk_step(pool, views, 1, 0))
    compiled.forward(*chunk_step(pool, views, 30, 1))
    assert compiled.stats()["graphs"] == 4 and compiled.stats()["compiled_steps"] == 4


def test_a_model_without_decoder_layers_is_recorded_and_runs_eagerly():
    prefill = CompiledPrefill(torch.nn.Linear(2, 2), None, device="cpu")
    assert prefill.stats()["failure"] == ("ValueError: CompiledLayers: Linear has no decoder layers with a "
                                          "self_attn module (get_decoder().layers[i].self_attn.layer_idx), nor a "
                                          "hybrid's blocks (an attention, recurrent or MLP / MoE mixer each: "
                                          "sim.real.hybrid)")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mode='reduce-overhead' captures CUDA graphs itself"):
        CompiledPrefill(None, None, device="cpu", mode="reduce-overhead")
    with pytest.raises(ValueError, match="sink_step: tokens=0; expected at least 1"):
        sink_step(None, ["full"], 4, "cpu", tokens=0)


def test_a_cli_replay_with_compiled_steps_writes_the_cost_replays_tables(tmp_path, monkeypatch, one_thread):
    """`unikv replay --executor real --decode-graphs --compile-decode
    --compile-prefill` (cost clock) writes the usual files, its steps and
    requests equal a cost-model replay's, and its summary says which steps
    ran compiled."""
    from tests.sim.real.replays import real_and_cost_replays, replay_args

    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", "aot_eager")
    common = replay_args(model_config(tmp_path, "gemma3"), 100, "0.0004")
    got, _ = real_and_cost_replays(tmp_path, common, ["--executor", "real", "--real-clock", "cost", "--decode-graphs",
                                                      "--compile-decode", "--compile-prefill"])
    s = got["summary"]
    assert got["identity"]["executor"]["compile_prefill"] is True
    assert s["prefill_compiled_steps"] > 0 and s["prefill_eager_steps"] == 0 and s["prefill_compile_failure"] is None
    assert s["graph_compiled"] == s["graph_buckets"] and s["graph_steps"] > 0


def test_after_the_executors_warm_up_no_step_compiles(tmp_path, monkeypatch, one_thread):
    """`RealExecutor.warm_up` (a CUDA run's start-up, before its clock)
    compiles the packed forward's graphs on the sink only; the replay after
    it compiles nothing more in its packed steps, and its tokens and tables
    equal a replay without the warm-up's."""
    build = real_executor.build_real_executor  # before compiled_replay wraps it
    torch._dynamo.reset()  # the compiles counted are this test's
    plain, plain_ex = compiled_replay(tmp_path / "plain", monkeypatch, "gemma3", 0.00004, "cpu", "aot_eager")
    torch._dynamo.reset()
    seen = {}
    monkeypatch.setattr(real_executor, "build_real_executor", warming(build, lambda ex: seen.update(ex.prefill.stats())))
    got, ex = compiled_replay(tmp_path / "warm", monkeypatch, "gemma3", 0.00004, "cpu", "aot_eager")
    assert seen["compiles"] == 2 and seen["graphs"] == 4  # two layer kinds: many tokens, one token
    s = got.summary
    assert s["prefill_compiles"] == 2 and s["prefill_graphs"] == 4 and s["prefill_compile_failure"] is None
    assert s["prefill_compiled_steps"] == 2 + int((got.steps["prefill_tokens"] > 0).sum())
    assert ex.generated == plain_ex.generated
    cols = ["step_time_s"]
    pd.testing.assert_frame_equal(got.steps.drop(columns=cols), plain.steps.drop(columns=cols))
