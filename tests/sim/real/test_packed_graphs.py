"""Packed (prefill and mixed) steps through static per-token-bucket buffers
(`sim.real.packed_graphs.PackedGraphs`, `RunConfig.prefill_graphs`).

On the CPU the buffers run eagerly (no capture), so the padding and the
bucketing are what these tests check; the compiled layers run through
"aot_eager" (see tests/sim/real/test_prefill.py). The capture itself is
the CUDA-marked tests'.
"""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from unikv.sim.config import RunConfig, SchedulerConfig  # noqa: E402
from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.batch import StepBatch, device_tables  # noqa: E402
from unikv.sim.real.packed_graphs import PackedGraphs  # noqa: E402
from unikv.sim.real.prefill import CompiledPrefill  # noqa: E402
from unikv.sim.run import run  # noqa: E402

from tests.sim.real.test_executor import (  # noqa: E402
    assert_transformers_tokens,
    lockstep_build,
    model_config,
    trace,
    trimmed,
    warming,
)
from tests.sim.real.test_graphs import pool_and_views  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = [CUDA, pytest.mark.gpu]


def packed_replay(tmp_path, monkeypatch, name: str, budget_gib: float, *, device: str = "cpu",
                  compile: bool = False, **options):
    """The executor tests' trace (prefix blocks, retractions, chunks of at
    most 48 tokens, up to 16 requests) with `prefill_graphs` (and, with
    `compile`, the compiled packed layers through "aot_eager" on the CPU,
    inductor on CUDA); `options`: PackedGraphs' arguments to override
    (`buckets`, `max_requests`). Returns (result, executor)."""
    from unikv.sim.real import packed_graphs

    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(trimmed(name)))
    built = {}
    build = real_executor.build_real_executor
    if options:
        monkeypatch.setattr(packed_graphs, "PackedGraphs", lambda *a, **k: PackedGraphs(*a, **(k | options)))
    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", "aot_eager" if device == "cpu" else "inductor")
    monkeypatch.setattr(real_executor, "build_real_executor", lambda *a, **k: built.setdefault("ex", build(*a, **k)))
    monkeypatch.setattr(real_executor, "build_batch", lockstep_build)
    config = RunConfig(trace="test", model=str(path), kv_cache_dtype="fp32", executor="real", real_clock="cost",
                       device=device, prefill_graphs=True, compile_prefill=compile,
                       kv_budget_gib=budget_gib, page_size=4, layout="end_end", compaction="lazy", check_every=1,
                       scheduler=SchedulerConfig(max_running=16, prefill_tokens_per_step=48, reserve_init=0.0,
                                                 reserve_min=0.0, reserve_decay=0.0))
    return run(config, trace_df=trace()), built["ex"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name,budget_gib", [("gemma3", 0.00004), ("llama", 0.00004)])
def test_a_replay_through_the_packed_buckets_gives_transformers_greedy_tokens(tmp_path, monkeypatch, one_thread,
                                                                            name, budget_gib, compile, device):
    """Chunked prefills, mixed steps, window layers (Gemma-3), prefix-cache
    hits (Llama), compaction and retractions: every packed step runs
    through a padded bucket (all of them fit the default buckets, and most
    are padded), and every request's tokens equal transformers' greedy run."""
    res, ex = packed_replay(tmp_path, monkeypatch, name, budget_gib, device=device, compile=compile)
    steps, s = res.steps, res.summary
    packed = int((steps["prefill_tokens"] > 0).sum())
    assert ((steps["prefill_tokens"] > 0) & (steps["decode_tokens"] > 0)).sum() > 0, "no mixed step"
    assert s["retractions"] > 0 and steps["moves"].iloc[-1] > 0
    through = s["packed_graph_steps_captured"] + s["packed_graph_steps_uncaptured"]
    assert through == packed and s["packed_graph_fallbacks"] == 0
    assert s["packed_graph_capture_failures"] == {}
    tokens = steps["prefill_tokens"] + steps["decode_tokens"]
    assert (~tokens[steps["prefill_tokens"] > 0].isin(ex.packed.buckets)).sum() > 0, "no step was padded"
    if device == "cpu":
        assert s["packed_graph_captured"] == [] and s["packed_graph_steps_captured"] == 0
    else:
        assert s["packed_graph_captured"] == s["packed_graph_buckets"] and s["packed_graph_steps_uncaptured"] == 0
    if compile:
        assert s["packed_graph_compiled"] == s["packed_graph_buckets"] and s["packed_graph_compile_failures"] == {}
        assert s["prefill_compile_failure"] is None and s["prefill_eager_steps"] == 0
    else:
        assert "packed_graph_compiled" not in s
    if name == "llama":
        assert res.requests["hit_tokens"].sum() > 0, "no prefix-cache hit read another request's KV"
    assert res.violations == []
    assert_transformers_tokens(res, ex)


def test_steps_past_the_largest_bucket_or_the_request_cap_run_as_before(tmp_path, monkeypatch, one_thread):
    """Buckets up to 32 tokens and a cap of 2 requests: the steps of more
    tokens or requests run as without the buckets, counted as fallbacks,
    the others through the buckets (among them steps of exactly 2
    requests), and the tokens still equal transformers'."""
    seen = {"cap": 0, "over": 0}
    run_packed = PackedGraphs.run

    def counting(self, batch):
        b, t = len(batch.requests), batch.num_tokens
        seen["cap"] += b == 2 and t <= 32
        seen["over"] += b > 2 and t <= 32
        return run_packed(self, batch)

    monkeypatch.setattr(PackedGraphs, "run", counting)
    res, ex = packed_replay(tmp_path, monkeypatch, "gemma3", 0.00004, buckets=(8, 16, 32), max_requests=2)
    steps, s = res.steps, res.summary
    packed = steps[steps["prefill_tokens"] > 0]
    big = int((packed["prefill_tokens"] + packed["decode_tokens"] > 32).sum())
    assert big > 0 and seen["over"] > 0 and seen["cap"] > 0
    assert s["packed_graph_fallbacks"] == big + seen["over"]
    assert s["packed_graph_steps_uncaptured"] == len(packed) - s["packed_graph_fallbacks"] > 0
    assert s["packed_graph_buckets"] and set(s["packed_graph_buckets"]) <= {8, 16, 32}  # built when first used
    assert_transformers_tokens(res, ex)


def test_each_fill_leaves_the_step_and_padding_only_whatever_the_steps_before_held():
    """Steps of growing and shrinking tokens, requests and table width
    through one bucket (16 tokens, 5 request slots): after every fill the
    buffers hold the step, then the padding: token 0 at position 0 writing
    virtual id 0, one padding request of the 16 - T left-over queries and
    keys over virtual row 0 (the sink), empty requests, kept row 0."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    packed = PackedGraphs(None, SimpleNamespace(page_size=4), ["full"], device="cpu", max_pages=9, max_requests=5)
    st = packed._static(16)
    assert st.requests == 5 and tuple(st.rows.shape) == (6, 9) and tuple(st.cu_q.shape) == (7,)
    for _ in range(60):
        b = int(rng.integers(1, 6))
        q = rng.integers(1, 4, b)
        t, width, s = int(q.sum()), int(rng.integers(1, 10)), int(rng.integers(0, b + 1))
        rows = torch.from_numpy(rng.integers(1, 1000, (b, width)))
        x = SimpleNamespace(input_ids=torch.from_numpy(rng.integers(1, 99, (1, t))),
                            position_ids=torch.from_numpy(rng.integers(1, 99, (1, t))),
                            write_vids=torch.from_numpy(rng.integers(1, 999, t)),
                            cu_q=torch.tensor(np.concatenate([[0], np.cumsum(q)]), dtype=torch.int32),
                            seq_lens=torch.from_numpy(q + rng.integers(0, 30, b)).to(torch.int32),
                            sample_rows=torch.from_numpy(rng.integers(0, t, s)), page_rows=rows)
        packed._fill(st, x, t, b, width)
        assert torch.equal(st.ids[0, :t], x.input_ids[0]) and not st.ids[0, t:].any()
        assert torch.equal(st.pos[0, :t], x.position_ids[0]) and not st.pos[0, t:].any()
        assert torch.equal(st.vids[:t], x.write_vids) and not st.vids[t:].any()
        assert torch.equal(st.cu_q[:b + 1], x.cu_q) and bool((st.cu_q[b + 1:] == 16).all())
        assert torch.equal(st.seq_lens[:b], x.seq_lens) and int(st.seq_lens[b]) == 16 - t
        assert not st.seq_lens[b + 1:].any()
        assert torch.equal(st.keep[:s], x.sample_rows) and not st.keep[s:].any()
        assert torch.equal(st.rows[:b, :width], rows) and not st.rows[:b, width:].any() and not st.rows[b:].any()


def test_after_the_executors_warm_up_every_bucket_is_built_and_the_tokens_are_the_same(tmp_path, monkeypatch,
                                                                                       one_thread):
    """`RealExecutor.warm_up` (a CUDA run's start-up, before its clock)
    builds every bucket (on CUDA: captures it) over the pool's sink only,
    the largest first; the replay after it gives the tokens and the tables
    of a replay without it."""
    build = real_executor.build_real_executor  # before packed_replay wraps it
    plain, plain_ex = packed_replay(tmp_path / "plain", monkeypatch, "gemma3", 0.00004, buckets=(16, 32, 64))
    built, seen, order = [], {}, []

    def count_builds(ex):  # the order the warm-up builds the buckets in
        make = ex.packed._build
        monkeypatch.setattr(ex.packed, "_build", lambda n: order.append(n) or make(n))

    def record(ex):
        seen.update(ex.packed.stats(), order=order)
        built.append(ex)

    monkeypatch.setattr(real_executor, "build_real_executor", warming(build, record, count_builds))
    got, ex = packed_replay(tmp_path / "warm", monkeypatch, "gemma3", 0.00004, buckets=(16, 32, 64))
    assert seen["order"] == [64, 32, 16] and seen["buckets"] == [16, 32, 64] and seen["steps_uncaptured"] == 0
    assert ex is built[0] and ex.generated == plain_ex.generated
    cols = ["step_time_s"]
    pd.testing.assert_frame_equal(got.steps.drop(columns=cols), plain.steps.drop(columns=cols))


def test_a_cli_replay_with_packed_graphs_writes_the_cost_replays_tables(tmp_path, monkeypatch, one_thread):
    """`unikv replay --executor real --prefill-graphs --compile-prefill`
    (cost clock) writes the usual files, its steps and requests equal a
    cost-model replay's, and its summary says how the packed steps ran."""
    from tests.sim.real.replays import real_and_cost_replays, replay_args

    monkeypatch.setattr(real_executor, "COMPILE_BACKEND", "aot_eager")
    common = replay_args(model_config(tmp_path, "gemma3"), 100, "0.0004")
    got, _ = real_and_cost_replays(tmp_path, common, ["--executor", "real", "--real-clock", "cost",
                                                      "--prefill-graphs", "--compile-prefill"])
    s = got["summary"]
    assert got["identity"]["executor"]["prefill_graphs"] is True
    assert s["packed_graph_steps_uncaptured"] > 0 and s["packed_graph_steps_captured"] == 0
    assert s["packed_graph_compiled"] == s["packed_graph_buckets"] and s["packed_graph_compile_failures"] == {}
    assert s["packed_graph_capture_failures"] == {} and s["prefill_compile_failure"] is None


# -- single packed steps: padded against unpadded --


def packed_step(pool, views, spans, seed: int, device: str = "cpu") -> StepBatch:
    """A packed step of requests `spans` = [(cached, new), ...] (each a fresh
    request whose first `cached` tokens are written by an earlier step, not
    this one), its pages allocated and the device tables committed; every
    request samples its last token."""
    ps, rng = pool.page_size, np.random.default_rng(seed)
    rows, vids, seqs = [], [], []
    for cached, new in spans:
        seq = cached + new
        v = np.asarray(pool.alloc_extend(np.zeros(1, np.int64), np.array([seq]), np.zeros(1, np.int64)))
        rows.append(v[::ps] // ps)
        vids.append(v[cached:])
        seqs.append(seq)
    pool.commit()  # as build_batch: the graph reads the device tables
    width = max(len(r) for r in rows)
    page_rows = torch.zeros((len(spans), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        page_rows[i, :len(r)] = torch.from_numpy(r)
    q = np.array([n for _, n in spans])
    tokens = int(q.sum())
    tables = {b: torch.as_tensor(pool.page_table(b)) for b in views.bands}
    pos = np.concatenate([np.arange(c, c + n) for c, n in spans])

    def dev(x, dtype=torch.int64):
        return torch.as_tensor(np.asarray(x), device=device).to(dtype)

    return StepBatch(layout="packed", input_ids=dev(rng.integers(0, 96, (1, tokens))),
                     position_ids=dev(pos).view(1, tokens),
                     cu_q=dev(np.concatenate([[0], np.cumsum(q)]), torch.int32),
                     seq_lens=dev(seqs, torch.int32), sample_rows=dev(np.cumsum(q) - 1),
                     samplers=(), requests=(None,) * len(spans),
                     **device_tables(page_rows.to(device), dev(np.concatenate(vids)), tables, ps))


def eager_picks(model, views, batch: StepBatch):
    from unikv.sim.real.attention import StepContext, use_step

    ctx = StepContext(views=views, block_tables=dict(batch.block_tables), cu_q=batch.cu_q, seq_lens=batch.seq_lens,
                      write_slots=dict(batch.write_slots), layout="packed")
    with torch.inference_mode(), use_step(ctx):
        out = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                    logits_to_keep=batch.sample_rows)
    return out.logits[0].argmax(-1)


# steps of T tokens against buckets (8, 16, 32): just below an edge, at it, just past it, of up to
# max_requests (4) requests; a bucket's steps shrink and grow (in tokens, requests and table width)
CASES = [[(0, 7)], [(0, 8)], [(0, 16)], [(0, 9)], [(3, 5), (0, 2), (6, 1), (2, 7)],
         [(0, 13), (5, 1), (9, 1), (1, 1)], [(20, 3)], [(4, 12), (7, 5)], [(0, 32)], [(0, 30), (2, 1), (3, 1)],
         [(1, 18)]]


STEP_DEVICES = [pytest.param("cpu", False, id="cpu-eager"), pytest.param("cpu", True, id="cpu-aot_eager"),
                pytest.param("cuda", False, id="cuda-eager", marks=GPU),
                pytest.param("cuda", True, id="cuda-inductor", marks=GPU)]


@pytest.mark.parametrize("device,compile", STEP_DEVICES)
def test_padded_steps_give_the_unpadded_picks_and_write_only_their_own_kv(gemma, device, compile):
    """Steps below, at and past the bucket edges, of one request up to the
    request cap, one after another through the same buckets (so a fill also
    resets what the step before left): the picks equal the unpadded eager
    forward's over an identical pool, and the two pools' K / V agree
    outside the sink to rounding (the padding wrote nowhere else; a matmul
    of 1-3 rows rounds differently from one of more, on the CPU too). On CUDA
    every bucket is captured (its compiled forward with `compile`) and the
    steps replay the graphs."""
    import copy

    model, layers = gemma
    if device == "cuda":
        model = copy.deepcopy(model).cuda()
    (pool_a, views_a), (pool_b, views_b) = pool_and_views(layers, device), pool_and_views(layers, device)
    prefill = (CompiledPrefill(model, views_b, device=device, backend="aot_eager" if device == "cpu" else "inductor")
               if compile else None)
    packed = PackedGraphs(model, views_b, views_b.bands, device=device, max_pages=12, max_requests=4,
                          buckets=(8, 16, 32), prefill=prefill)
    packed.warm_up()
    sink = pool_a.layout.sink_bytes
    for seed, spans in enumerate(CASES):
        want = eager_picks(model, views_a, packed_step(pool_a, views_a, spans, seed, device))
        got = packed.run(packed_step(pool_b, views_b, spans, seed, device))
        assert torch.equal(got, want), spans
        a, b = (torch.as_tensor(p.buffer)[sink:].view(torch.float32) for p in (pool_a, pool_b))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, spans=spans: f"{spans}: {m}")
    stats = packed.stats()
    assert stats["buckets"] == [8, 16, 32] and stats["fallbacks"] == 0 and stats["failures"] == {}
    if device == "cpu":
        assert stats["captured"] == [] and stats["steps_uncaptured"] == len(CASES)
    else:
        assert stats["captured"] == [8, 16, 32] and stats["steps_captured"] == len(CASES)
    if compile:
        assert stats["compiled"] == [8, 16, 32] and stats["compile_failures"] == {}
        assert prefill.stats()["failure"] is None and prefill.stats()["eager_steps"] == 0


def test_what_no_bucket_takes_is_handed_back(gemma):
    """More tokens than the largest bucket, more requests than the cap, a
    table wider than max_pages, a decode (padded) batch: None, counted."""
    model, layers = gemma
    pool, views = pool_and_views(layers)
    packed = PackedGraphs(model, views, views.bands, device="cpu", max_pages=8, max_requests=2, buckets=(8, 16))
    assert packed.run(packed_step(pool, views, [(0, 17)], 0)) is None  # 17 tokens
    assert packed.run(packed_step(pool, views, [(0, 1), (0, 1), (0, 1)], 1)) is None  # 3 requests
    assert packed.run(packed_step(pool, views, [(34, 2)], 2)) is None  # 9 pages
    assert packed.stats()["fallbacks"] == 3 and packed.stats()["buckets"] == []
    decode = packed_step(pool, views, [(0, 2)], 3)
    assert packed.run(decode.__class__(**{**vars(decode), "layout": "padded"})) is None
    assert packed.run(packed_step(pool, views, [(28, 4)], 4)) is not None  # 8 pages: the widest table taken


def test_the_warm_up_builds_every_bucket_and_writes_only_the_sink(gemma):
    model, layers = gemma
    pool, views = pool_and_views(layers)
    before = pool.buffer.copy()
    packed = PackedGraphs(model, views, views.bands, device="cpu", max_pages=8, max_requests=2, buckets=(8, 16))
    packed.warm_up()
    for st in packed._buckets.values():  # a fresh bucket's padding request holds every token
        packed._forward(st)
    sink = pool.layout.sink_bytes
    assert (pool.buffer[sink:] == before[sink:]).all() and packed.stats()["buckets"] == [8, 16]


@pytest.mark.parametrize("kwargs,words", [
    (dict(max_pages=0), "max_pages=0; expected an int >= 1"),
    (dict(max_requests=True), "max_requests=True; expected an int >= 1"),
    (dict(buckets=()), "buckets=[]; expected one or more ints >= 1"),
    (dict(buckets=(8, 0)), "buckets=[8, 0]; expected one or more ints >= 1"),
])
def test_bad_arguments_are_refused(gemma, kwargs, words):
    _, layers = gemma
    _, views = pool_and_views(layers)
    args = dict(device="cpu", max_pages=8, max_requests=2, buckets=(8, 16)) | kwargs
    with pytest.raises(ValueError, match=f"^PackedGraphs: {words.replace('[', '.').replace(']', '.')}$"):
        PackedGraphs(None, views, views.bands, **args)


def test_registering_without_a_mask_removes_an_earlier_mask_function():
    """A captured packed step must not run transformers' mask preprocessing
    (its packed-sequence check reads the device): `register(mask=False)`
    after `register(mask=True)` in one process leaves no mask function."""
    from transformers import AttentionMaskInterface
    from unikv.sim.real.attention import register, unikv_mask

    name = "unikv_mask_then_none"
    register(name, mask=True)
    assert AttentionMaskInterface._global_mapping[name] is unikv_mask
    assert register(name, mask=False) == name and name not in AttentionMaskInterface._global_mapping
    register(name, mask=False)  # idempotent
    assert name not in AttentionMaskInterface._global_mapping


def test_a_run_without_packed_graphs_counts_its_packed_steps_as_fallbacks_and_says_why():
    """No PackedGraphs built (a model whose recurrent layers have no padded
    path, test_padded_chunk.py): every packed step is a fallback and the
    summary gives the executor's reason, or a plain one."""
    from types import SimpleNamespace

    from unikv.sim.real.executor import packed_graph_summary

    s = packed_graph_summary(SimpleNamespace(packed=None, packed_off="PackedGraphs: no padded path",
                                             decode_only=[True, False, False, True]))
    assert s["packed_graph_fallbacks"] == 2 and s["packed_graph_steps_captured"] == 0
    assert s["packed_graph_off"] == "PackedGraphs: no padded path"
    s = packed_graph_summary(SimpleNamespace(packed=None, packed_off=None, decode_only=[False]))
    assert s["packed_graph_off"].startswith("no packed graphs were built")


def test_a_compile_that_fails_leaves_every_bucket_eager_with_the_eager_picks(gemma):
    """A backend that raises: the steps still give the eager forward's picks,
    no bucket counts as compiled, and the compiled prefill says why."""
    model, layers = gemma
    (pool_a, views_a), (pool_b, views_b) = pool_and_views(layers), pool_and_views(layers)

    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    prefill = CompiledPrefill(model, views_b, device="cpu", backend=broken)
    packed = PackedGraphs(model, views_b, views_b.bands, device="cpu", max_pages=12, max_requests=4,
                          buckets=(8, 16), prefill=prefill)
    for seed, spans in enumerate([[(0, 7)], [(2, 3), (0, 9)]]):
        want = eager_picks(model, views_a, packed_step(pool_a, views_a, spans, seed))
        assert torch.equal(packed.run(packed_step(pool_b, views_b, spans, seed)), want)
    stats = packed.stats()
    assert stats["buckets"] == [8, 16] and stats["compiled"] == [] and stats["steps_uncaptured"] == 2
    assert "this backend cannot compile" in prefill.stats()["failure"]
