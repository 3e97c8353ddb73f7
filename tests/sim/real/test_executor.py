"""Greedy generation through the pool equals transformers' own cache.

Sixteen requests of varied prompt and output lengths, some sharing prefix
blocks, arrive over time and run through the real scheduler (`sim.run`)
with the real executor: every step is one forward whose attention writes
and reads the pool. The budget is tight and the decode reserve off, so
compaction moves pages and running requests are retracted mid-generation
(the test counts both and fails without them). Each request's tokens must
equal transformers' greedy generation of that request alone, with its own
`DynamicCache` and the same weights. Configs: trimmed copies (2-3 layers,
hidden 64, vocab 256) of Llama-3.1-8B, gpt-oss-20b and Gemma-3 text;
fp32; `real_clock="cost"` (the cost model's clock: deterministic steps).
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from unikv.sim.config import RunConfig, SchedulerConfig  # noqa: E402
from unikv.sim.memory import Memory  # noqa: E402
from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.batch import build_batch  # noqa: E402
from unikv.sim.request import Request  # noqa: E402
from unikv.sim.run import run  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
             vocab_size=256, max_position_embeddings=16384, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, torch_dtype="float32")
N = 16


def trimmed(name: str) -> dict:
    """A real config cut to a CPU-test size (its architecture's own fields kept)."""
    if name == "gemma3":  # no Gemma-3 config.json copy is bundled: its text config's fields
        return dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=3,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    sliding_window=8, query_pre_attn_scalar=16, rope_theta=1_000_000.0, **SMALL)
    source = {"llama": "meta-llama--Meta-Llama-3.1-8B_config.json",
              "gpt_oss": "openai--gpt-oss-20b_config.json"}[name]
    cfg = json.loads((CONFIGS / source).read_text())
    cfg.update(SMALL, num_hidden_layers=2)
    if name == "gpt_oss":
        cfg.pop("quantization_config")
        cfg.update(layer_types=["sliding_attention", "full_attention"], sliding_window=8, num_local_experts=4,
                   num_experts_per_tok=2, experts_per_token=2, intermediate_size=64)
        cfg["rope_scaling"] = dict(cfg["rope_scaling"], original_max_position_embeddings=4096)
    return cfg


def trace() -> pd.DataFrame:
    """16 requests, one every 2 ms; even ones share two 8-token prefix blocks."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"arrival_s": np.arange(N) * 0.002, "prompt_tokens": rng.integers(5, 40, N),
                       "output_tokens": rng.integers(2, 12, N),
                       "prefix_hashes": [[100, 101, 200 + i] if i % 2 == 0 else [] for i in range(N)]})
    df.attrs["block_tokens"] = 8
    return df


def replay(tmp_path, monkeypatch, name: str, compaction: str, budget_gib: float, device: str = "cpu",
           graphs: bool = False, clock: str = "cost", layout: str = "end_end"):
    """Run the trace; returns (result, executor, generated counts at each retraction)."""
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(trimmed(name)))
    built, retracted_at = {}, []
    build = real_executor.build_real_executor
    monkeypatch.setattr(real_executor, "build_real_executor",
                        lambda *a, **k: built.setdefault("ex", build(*a, **k)))
    retract = Memory.retract

    def counting_retract(self, req, now):
        retracted_at.append(req.generated)
        retract(self, req, now)

    monkeypatch.setattr(Memory, "retract", counting_retract)
    monkeypatch.setattr(real_executor, "build_batch", lockstep_build)
    config = RunConfig(trace="test", model=str(path), kv_cache_dtype="fp32", executor="real", real_clock=clock,
                       device=device, decode_graphs=graphs,
                       kv_budget_gib=budget_gib, page_size=4, layout=layout, compaction=compaction,
                       check_every=1, scheduler=SchedulerConfig(
                           max_running=16, prefill_tokens_per_step=48, reserve_init=0.0, reserve_min=0.0,
                           reserve_decay=0.0))
    return run(config, trace_df=trace()), built["ex"], retracted_at


LOCKSTEP = {"steps": 0, "cells": 0}


def lockstep_build(plan, pool, *args, **kwargs):
    """`build_batch` (virtual rows kept on the device across steps, translated
    there), checked each step against its readable twin (`readable=True`:
    every page translated on the host tables): equal block tables (released,
    unbound and padding pages 0, the sink) and write slots on every band."""
    fast = build_batch(plan, pool, *args, **kwargs)
    ref = build_batch(plan, pool, *args, readable=True, **kwargs)
    for band in ref.block_tables:
        assert torch.equal(fast.block_tables[band], ref.block_tables[band]), (plan.index, band)
        assert torch.equal(fast.write_slots[band], ref.write_slots[band]), (plan.index, band)
        LOCKSTEP["cells"] += ref.block_tables[band].numel()
    LOCKSTEP["steps"] += 1
    return fast


def reference(model, prompt: np.ndarray, n: int) -> list[int]:
    """transformers' greedy decoding of one request with its own DynamicCache
    (passed as `cache` where the forward takes it, transformers 5.24, else as
    `past_key_values`, 5.17)."""
    import inspect

    from transformers import DynamicCache

    device = model.device
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kw = {key: DynamicCache(config=model.config), "use_cache": True}
    out = model(input_ids=torch.tensor(prompt, device=device)[None], **kw)
    tokens: list[int] = []
    for _ in range(n):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), **kw)
    return tokens


def assert_transformers_tokens(res, ex) -> None:
    """Every request of the replay `res` generated, through the executor
    `ex`, the tokens transformers' greedy run gives it with its own cache
    (eager attention)."""
    model = ex.model
    model.set_attn_implementation("eager")
    hashes = trace()["prefix_hashes"]
    with torch.inference_mode():
        for rid, prompt, out in zip(res.requests["rid"], res.requests["prompt_tokens"], res.requests["output_tokens"]):
            req = Request(int(rid), 0.0, int(prompt), int(out), tuple(hashes[int(rid)]))
            assert ex.generated[int(rid)] == reference(model, ex.tokens.prompt(req), int(out)), f"request {rid}"


CASES = [("llama", "lazy", 0.00004), ("llama", "eager", 0.00003), ("gemma3", "eager", 0.00004),
         ("gpt_oss", "lazy", 0.00003)]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


GPU = [CUDA, pytest.mark.gpu]


@pytest.mark.parametrize("name,compaction,budget_gib,device,graphs",
                         [(*c, "cpu", False) for c in CASES] + [("gpt_oss", "lazy", 0.00003, "cpu", True)]
                         + [pytest.param(*c, "cuda", False, marks=GPU) for c in CASES]
                         + [pytest.param(*c, "cuda", True, marks=GPU) for c in CASES])
def test_greedy_tokens_through_the_pool_equal_transformers_own_cache(tmp_path, monkeypatch, one_thread, name,
                                                                     compaction, budget_gib, device, graphs):
    """`graphs`: decode steps through the per-bucket static buffers
    (`sim.real.graphs`; captured as CUDA graphs on a GPU)."""
    steps_before = LOCKSTEP["steps"]
    res, ex, retracted_at = replay(tmp_path, monkeypatch, name, compaction, budget_gib, device, graphs)
    assert LOCKSTEP["steps"] - steps_before == len(res.steps)  # every step checked against the readable tables
    if graphs:
        assert res.summary["graph_steps"] > 0
        captured = res.summary["graph_captured"]
        if device == "cpu":
            assert captured == []
        elif name != "gpt_oss":  # transformers' eager MoE may not be capturable: then it says why
            assert captured and not res.summary["graph_capture_failures"], res.summary["graph_capture_failures"]
    assert res.violations == []
    steps, requests = res.steps, res.requests
    assert steps["moves"].iloc[-1] > 0, "compaction moved no page: the budget is not tight enough"
    assert any(g > 0 for g in retracted_at), "no request was retracted mid-generation"
    assert steps["admitted"].iloc[0] < N  # arrivals over time, not one batch
    assert res.summary["executor"] == "real" and res.summary["real_forward_tokens"] > 0
    if name == "llama":  # a window model's prefix hits need the window still bound: not asked here
        assert requests["hit_tokens"].sum() > 0, "no prefix-cache hit read another request's KV"
    assert_transformers_tokens(res, ex)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_local_weights_load_onto_the_meta_built_model(tmp_path, one_thread, name):
    """A folder of safetensors replaces the random weights exactly (the
    meta build's rotary and embedding-scale buffers rebuilt on the device)."""
    from safetensors.torch import save_file
    from unikv.sim.real.model import build_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(trimmed(name)))
    source = build_model(path, seed=7)
    (tmp_path / "w").mkdir()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "w" / "model.safetensors"))
    loaded = build_model(path, weights=tmp_path / "w", seed=0)
    ids = torch.randint(0, 256, (1, 12))
    with torch.inference_mode():
        assert torch.equal(source(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert not torch.equal(build_model(path, seed=0)(input_ids=ids).logits, loaded(input_ids=ids).logits)


def model_config(tmp_path, name: str = "llama") -> Path:
    """The trimmed config of `name` (CONFIGS) as a model folder's
    config.json, for the CLI (`cli_probe`, in tests/bad_input, made
    importable)."""
    import sys

    probe = str(Path(__file__).resolve().parents[2] / "bad_input")
    if probe not in sys.path:
        sys.path.insert(0, probe)
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(trimmed(name)))
    return path


def test_a_real_replay_of_a_bundled_slice_writes_the_cost_replays_tables(tmp_path, one_thread):
    """`unikv replay --executor real` on a bundled trace slice writes the usual
    files; with the cost clock its steps and requests equal a cost-model
    replay's, step for step (same boundaries, same memory decisions), and
    its summary holds the cost replay's columns plus the executor's."""
    from tests.sim.real.replays import real_and_cost_replays, replay_args

    common = replay_args(model_config(tmp_path), 40, "0.00004")
    got, want = real_and_cost_replays(tmp_path, common, ["--executor", "real", "--real-clock", "cost"])
    assert set(want["summary"]) < set(got["summary"])
    assert got["summary"]["executor"] == "real" and got["summary"]["real_steps"] == len(
        pd.read_parquet(tmp_path / "real" / "steps.parquet"))
    assert got["identity"]["executor"]["weights"] == "random (seed 0)"
    assert want["identity"]["executor"] == {"executor": "cost"}


def test_a_measured_real_replay_is_not_scored_against_the_cost_clocks_oracle(tmp_path, one_thread):
    """The oracle runs on the cost model's clock: against a replay on the
    measured clock its mean running requests are not comparable, so the
    replay runs no oracle and prints no efficiency; on the cost clock it does."""
    path = model_config(tmp_path)  # makes cli_probe importable
    from cli_probe import run_cli

    common = ["replay", "--trace", "azure_conv", "--max-requests", "3", "--max-context-tokens", "24",
              "--model", path, "--kv-cache-dtype", "fp32", "--kv-budget-gib", "0.00004", "--page-size", "4",
              "--oversize", "reject", "--no-figures", "--executor", "real"]
    runs = {clock: run_cli([*common, "--real-clock", clock, "--out", tmp_path / clock]) for clock in ("measured", "cost")}
    assert all(r.rc == 0 for r in runs.values()), {k: r.stderr for k, r in runs.items()}
    summary = {k: json.loads((tmp_path / k / "summary.json").read_text())["summary"] for k in runs}
    assert "capacity_efficiency" not in summary["measured"] and "capacity_efficiency" in summary["cost"]
    line = next(x for x in runs["measured"].stdout.splitlines() if "capacity efficiency vs oracle" in x)
    assert line.split()[-1] == "n/a"


def test_the_measured_clock_advances_by_each_steps_measured_time(tmp_path, monkeypatch, one_thread):
    res, ex, _ = replay(tmp_path, monkeypatch, "llama", "lazy", 0.0001, clock="measured")
    times = res.steps["step_time_s"].tolist()
    assert times == ex.step_s and all(t > 0 for t in times)
    assert res.summary["real_step_s_total"] == pytest.approx(sum(times))
    # the forward is timed apart from the rest of the step (the cost model's non_forward_s)
    assert len(ex.forward_s) == len(ex.decode_only) == len(times)
    assert all(0 < f < t for f, t in zip(ex.forward_s, times))
    assert ex.decode_only.count(True) == int((res.steps["prefill_tokens"] == 0).sum())
    rest = sorted(t - f for t, f in zip(times, ex.forward_s))
    assert rest[0] <= res.summary["real_non_forward_s_median"] <= rest[-1]
    assert res.summary["real_forward_s_total"] == pytest.approx(sum(ex.forward_s))


def test_a_layout_that_folds_the_window_layers_into_the_full_band(tmp_path, monkeypatch, one_thread):
    """SGLang's layout keeps Gemma-3's window layers on the full band (no
    window release): the attention still masks the window, tokens equal."""
    res, ex, _ = replay(tmp_path, monkeypatch, "gemma3", "lazy", 0.00008, layout="sglang")
    assert res.violations == [] and ex.views.band(0) == "full" and ex.bands == ("full",)
    assert_transformers_tokens(res, ex)


def warming(build, record, prepare=None):
    """`build` (`build_real_executor`) wrapped as a CUDA run's start-up: the
    executor handed to `prepare` (if any), warmed up, checked to have
    written nothing past the pool's sink, then handed to `record`."""
    def warmed(config, memory, *a, **k):
        ex = build(config, memory, *a, **k)
        before = memory.pool.buffer.copy()
        if prepare is not None:
            prepare(ex)
        ex.warm_up(config.scheduler.max_running)
        sink = memory.pool.layout.sink_bytes
        assert (memory.pool.buffer[sink:] == before[sink:]).all()  # nothing past the sink written
        record(ex)
        return ex

    return warmed


def test_the_warm_up_touches_only_the_sink_and_builds_every_bucket_first(tmp_path, monkeypatch, one_thread):
    """`RealExecutor.warm_up` (what a CUDA run does before its clock starts):
    one forward into the sink and every decode bucket up to the running
    cap, built before the first step. A replay after it generates the same
    tokens and writes the same tables as one without it."""
    build = real_executor.build_real_executor  # before replay() wraps it (the wrapper returns its run's executor)
    plain, plain_ex, _ = replay(tmp_path / "plain", monkeypatch, "gpt_oss", "lazy", 0.00003, graphs=True)
    seen = {}
    monkeypatch.setattr(real_executor, "build_real_executor",
                        warming(build, lambda ex: seen.update(buckets=ex.graphs.stats()["buckets"])))
    got, ex, _ = replay(tmp_path / "warm", monkeypatch, "gpt_oss", "lazy", 0.00003, graphs=True)
    assert seen["buckets"] == [1, 2, 4, 8, 16]  # the cap is 16 running requests
    assert ex is not plain_ex and ex.generated == plain_ex.generated
    pd.testing.assert_frame_equal(got.steps.drop(columns=["step_time_s"]), plain.steps.drop(columns=["step_time_s"]))


def test_a_compiled_decode_replay_fuses_the_projections_and_keeps_the_cost_replays_tables(tmp_path, monkeypatch,
                                                                                          one_thread):
    """`--decode-graphs --compile-decode`: every layer's q/k/v and gate/up run
    fused (the summary counts them), the decode buckets compile without a
    failure, and the tables still equal a cost-model replay's."""
    from tests.sim.real.replays import real_and_cost_replays, replay_args

    # inductor's C++ build takes about a minute on 2 CPU cores; dynamo + AOTAutograd trace the same graphs
    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", "aot_eager")
    path = model_config(tmp_path)
    layers = json.loads(path.read_text())["num_hidden_layers"]
    common = replay_args(path, 200, "0.0004")
    got, _ = real_and_cost_replays(tmp_path, common, ["--executor", "real", "--real-clock", "cost",
                                                      "--decode-graphs", "--compile-decode"])
    summary = got["summary"]
    assert summary["fused_projections"] == {"attention": layers, "mlp": layers, "skipped": {}}
    assert summary["graph_steps"] > 0 and summary["graph_compile_failures"] == {}
