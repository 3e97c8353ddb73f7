"""A Nemotron-H hybrid replayed through `sim.run` with the real executor, its Mamba-2 state in the pool's slots.

The model is Nemotron-H-56B's config trimmed to 4 layers (mamba, attention,
mamba, MLP), hidden 64, random weights, fp32 on the CPU. Eighteen requests
of varied prompt (5-39) and output (2-11) lengths arrive one every 2 ms and
run through the real scheduler and memory layer (`sim.run.run`,
`executor="real"`, layout `end_end`: `mamba(up) | full(down)`). The memory
layer gives each running request a state slot; the executor gathers the
step's requests' state from those slots into the model's cache before each
forward and scatters it back after (`sim.real.state.StateBinder`): every
prefill chunk runs alone (at most 16 tokens per step, so long prompts
prefill in several chunks, each continuing from the state the previous one
left), decoders run together `[B, 1]`. The budget is tight and the decode
reserve off, so pages and state slots move under compaction and running
requests are retracted mid-generation (their readmission recomputes the
state from position 0 in a new slot); the test counts both and fails
without them, then compares every generated token with transformers' own
greedy `generate` of the request alone (its own cache, the same weights).
A control that starts every forward from zero state changes tokens.

With decode graphs (`sim.real.graphs.DecodeGraphs` with the state binder),
24 requests (16 and more decoding together) run their decoders through the
buckets, the Mamba-2 state updated in its slots (LFM2's short-conv state
gathered and scattered) inside each bucket's forward: the
tokens are transformers' again, the padding rows touch no live slot (the
padding slot poisoned with NaN, every other slot's bytes checked), and the
bucket forwards read no tensor on the host; on a GPU every bucket is
captured (`-m gpu`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim import run as sim_run  # noqa: E402
from unikv.sim.config import RunConfig, SchedulerConfig  # noqa: E402
from unikv.sim.memory import Memory  # noqa: E402
from unikv.sim.model_spec import ModelSpec  # noqa: E402
from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.batch import build_batch  # noqa: E402
from unikv.sim.request import Request  # noqa: E402

SOURCE = Path(__file__).resolve().parents[2] / "data" / "configs" / "nvidia--Nemotron-H-56B-Base-8K_config.json"
TRIM = {"hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
        "conv_kernel": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_head_dim": 16,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "chunk_size": 8,
        "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4, "time_step_rank": 8,
        "initializer_range": 0.1, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0}
N = 18
BUDGET_GIB = 44_000 / 2**30  # bytes: state slots and KV pages move, 15 retractions after generating (52 KB: none)


# LFM2 (short conv + full attention, `models/lfm2`), the fields of LiquidAI/LFM2-1.2B's config.json at CPU size
LFM2 = {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "block_auto_adjust_ff_dim": False, "vocab_size": 256,
        "num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "conv"], "conv_L_cache": 3,
        "conv_bias": False, "max_position_embeddings": 4096, "norm_eps": 1e-5, "initializer_range": 0.1,
        "tie_word_embeddings": True, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0}


# Nemotron-3-Nano-30B-A3B (Mamba-2 + attention + MoE, `NemotronHMoE`) trimmed as TRIM, its MoE to 8 experts
NANO = SOURCE.parent / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"
NANO_TRIM = TRIM | {"hybrid_override_pattern": "M*ME", "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 64, "n_group": 1,
                    "topk_group": 1}


def config_file(tmp_path: Path, name: str = "nemotron_h") -> Path:
    if name == "lfm2":
        raw = LFM2
    else:
        raw = json.loads((NANO if name == "nemotron_moe" else SOURCE).read_text())
        raw |= NANO_TRIM if name == "nemotron_moe" else TRIM
        raw.pop("auto_map", None)
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return path


def trace(n: int = N, outputs: tuple[int, int] = (2, 12), every_s: float = 0.002) -> pd.DataFrame:
    """`n` requests (prompts 5-39 tokens, outputs in `outputs`), one every
    `every_s`, no prefix hashes (the real executor refuses prefix caching
    for recurrent models)."""
    rng = np.random.default_rng(1)
    return pd.DataFrame({"arrival_s": np.arange(n) * every_s, "prompt_tokens": rng.integers(5, 40, n),
                         "output_tokens": rng.integers(*outputs, n)})


def fp32_conv(spec: ModelSpec) -> ModelSpec:
    """The spec with its conv state in 4 bytes per element, as an fp32
    model keeps it. unikv's `ModelSpec` supports only 2-byte conv state
    (`legacy_state_dtype`), so the same bytes are given as twice the bf16
    conv elements; the executor checks the state band's bytes against the
    model's own state (`sim.real.state.pool_state_views`)."""
    (kind,) = spec.state_kinds
    wide = dataclasses.replace(kind, conv_elems=2 * kind.conv_elems)
    return dataclasses.replace(spec, state_kinds=(wide,), state_bytes=wide.bytes_per_request)


def replay(tmp_path, monkeypatch, compaction: str, *, zero_state: bool = False, clock: str = "cost",
           name: str = "nemotron_h", budget_gib: float = BUDGET_GIB, graphs: bool = False, on_build=None,
           requests: pd.DataFrame | None = None, running: int = 16, prefill_tokens: int = 16,
           device: str = "cpu", compile_prefill: bool = False, prefill_graphs: bool = False):
    """Run the trace (`requests`, default `trace()`) with at most `running`
    requests and `prefill_tokens` prefill tokens a step; returns (result,
    executor, generated counts at each retraction, chunks that continued a
    prefill from its slot's state). `on_build`: called with the executor
    once built. `compile_prefill`: the prefill chunks through compiled
    layers (`RunConfig.compile_prefill`); `prefill_graphs`: through the
    packed buckets, padded (`RunConfig.prefill_graphs`)."""
    load = sim_run.load_model
    monkeypatch.setattr(sim_run, "load_model", lambda *a, **k: fp32_conv(load(*a, **k)))
    built, retracted_at, continued = {}, [], []
    build = real_executor.build_real_executor

    def building(*a, **k):
        ex = build(*a, **k)
        if zero_state:  # the control: every forward starts from no state, as without the binder
            before = ex.binder.before
            ex.binder.before = lambda slots, fresh=False: before(slots, fresh=True)
        if on_build is not None:
            on_build(ex)
        return built.setdefault("ex", ex)

    monkeypatch.setattr(real_executor, "build_real_executor", building)
    retract = Memory.retract

    def counting_retract(self, req, now):
        retracted_at.append(req.generated)
        retract(self, req, now)

    monkeypatch.setattr(Memory, "retract", counting_retract)
    split = real_executor.state_plans

    def splitting(plan):
        parts = split(plan)
        continued.extend(p.prefill[0][0].rid for p, fresh in parts if p.prefill and not fresh)
        return parts

    monkeypatch.setattr(real_executor, "state_plans", splitting)
    monkeypatch.setattr(real_executor, "build_batch", lockstep_build)
    config = RunConfig(trace="test", model=str(config_file(tmp_path, name)), kv_cache_dtype="fp32",
                       executor="real", real_clock=clock, decode_graphs=graphs, kv_budget_gib=budget_gib, device=device,
                       compile_prefill=compile_prefill, prefill_graphs=prefill_graphs,
                       page_size=4, layout="end_end",
                       compaction=compaction, check_every=1, scheduler=SchedulerConfig(
                           max_running=running, prefill_tokens_per_step=prefill_tokens, reserve_init=0.0,
                           reserve_min=0.0, reserve_decay=0.0, prefix_cache=False))
    res = sim_run.run(config, trace_df=trace() if requests is None else requests)
    return res, built["ex"], retracted_at, continued


def lockstep_build(plan, pool, *args, **kwargs):
    """`build_batch`, its device tables held equal to the host-built ones at every forward."""
    fast = build_batch(plan, pool, *args, **kwargs)
    ref = build_batch(plan, pool, *args, readable=True, **kwargs)
    for band in ref.block_tables:
        assert torch.equal(fast.block_tables[band], ref.block_tables[band]), (plan.index, band)
        assert torch.equal(fast.write_slots[band], ref.write_slots[band]), (plan.index, band)
    return fast


def references(model, ex, requests: pd.DataFrame) -> dict[int, list[int]]:
    """transformers' own greedy generation of each request alone (its own
    cache), past the eos token as the replay goes (no stop tokens: the
    trace's output length ends a request)."""
    model.set_attn_implementation("eager")
    eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    out = {}
    with torch.inference_mode():
        for rid, prompt, n in zip(requests["rid"], requests["prompt_tokens"], requests["output_tokens"]):
            ids = torch.as_tensor(ex.tokens.prompt(Request(int(rid), 0.0, int(prompt), int(n))))[None].to(model.device)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(n), do_sample=False,
                                 pad_token_id=0)
            out[int(rid)] = gen[0, ids.shape[1]:].tolist()
    model.generation_config.eos_token_id = eos
    return out


CASES = [("nemotron_h", "lazy"), ("nemotron_h", "eager"), ("lfm2", "lazy"), ("lfm2", "eager")]
BUDGETS = {"nemotron_h": BUDGET_GIB, "lfm2": 27_000 / 2**30}  # LFM2: 3 retractions after generating (lazy and eager)


@pytest.mark.parametrize("name,compaction", CASES)
def test_a_hybrids_replay_through_sim_run_equals_transformers_greedy_tokens(tmp_path, monkeypatch, one_thread,
                                                                           name, compaction):
    res, ex, retracted_at, continued = replay(tmp_path, monkeypatch, compaction, name=name,
                                              budget_gib=BUDGETS[name])
    assert res.violations == []
    assert ex.binder is not None and ex.state_band == "mamba"
    stats = ex.mem.pool.stats()["bands"]
    assert res.steps["moves"].iloc[-1] > 0 and stats["full"]["moves"] > 0, "compaction moved no KV page"
    assert stats["mamba"]["moves"] > 0, "no state slot moved under the views"
    assert any(g > 0 for g in retracted_at), "no request was retracted mid-generation"
    assert continued, "no prefill continued from the state its previous chunk left"
    assert res.steps["admitted"].iloc[0] < N and len(res.requests) == N
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


@pytest.mark.parametrize("family", ["nemotron_h", "lfm2"])
def test_a_mamba2_prefill_scans_through_unikvs_scan_and_keeps_transformers_tokens(tmp_path, monkeypatch,
                                                                                      one_thread, family):
    """The executor runs a Nemotron-H forward with `sim.real.ssd`'s scan in
    transformers' place (`kernel_chunk_scan`: the Triton kernels on CUDA,
    their einsum reference on the CPU): every prefill chunk,
    continued ones included, scans through it, and the tokens are still
    those of transformers' own scan and cache; LFM2 (short conv, no scan)
    runs without the swap."""
    import contextlib

    from unikv.sim.real import ssd

    calls: list[tuple[int, bool]] = []
    scan = ssd.chunk_scan

    def counting(x, *args, **kwargs):
        calls.append((x.shape[1], kwargs.get("initial_states") is not None))
        return scan(x, *args, **kwargs)

    monkeypatch.setattr(ssd, "chunk_scan", counting)
    res, ex, _, continued = replay(tmp_path, monkeypatch, "lazy", name=family, budget_gib=BUDGETS[family])
    assert res.violations == []
    if family == "lfm2":
        assert ex.scan is contextlib.nullcontext and calls == []
        return
    assert ex.scan is ssd.kernel_chunk_scan and continued
    assert len(calls) > 0 and any(initial for _, initial in calls), "no chunk scanned from a slot's state"
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


@pytest.mark.parametrize("name", ["nemotron_h", "lfm2"])
def test_control_a_replay_that_drops_the_state_between_forwards_changes_tokens(tmp_path, monkeypatch, one_thread,
                                                                               name):
    res, ex, _, _ = replay(tmp_path, monkeypatch, "lazy", zero_state=True, name=name, budget_gib=BUDGETS[name])
    want = references(ex.model, ex, res.requests)
    assert any(ex.generated[rid] != want[rid] for rid in want)


def test_the_forward_timing_spans_every_sub_forward_of_a_step(tmp_path, monkeypatch, one_thread):
    """With the measured clock, each step's forward time covers its prefill
    chunks' and its decoders' forwards (one span), inside the step's time."""
    res, ex, _, _ = replay(tmp_path, monkeypatch, "lazy", clock="measured")
    assert res.steps["step_time_s"].tolist() == ex.step_s
    times = res.steps["step_time_s"].tolist()
    assert len(ex.forward_s) == len(ex.decode_only) == len(ex.step_s) == len(times)
    assert all(0 < f < t for f, t in zip(ex.forward_s, ex.step_s))
    assert ex.decode_only.count(True) == int((res.steps["prefill_tokens"] == 0).sum())
    # the state gather / scatter is timed inside the forward's span, and summarised
    assert len(ex.state_s) == len(times) and all(0 < b < f for b, f in zip(ex.state_s, ex.forward_s))
    assert res.summary["real_state_s_total"] == pytest.approx(sum(ex.state_s))
    assert 0 < res.summary["real_state_share_of_forward"] < 1


HOST_READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::equal",
              "aten::masked_select", "aten::unique", "aten::_unique2", "aten::unique_consecutive"}
"""Operators that read a tensor's data on the host (`.item()`, `bool(t)`,
one-argument `torch.where`, ...) or size their output by it: a CUDA graph
capture cannot hold them. (`.tolist()` and `.cpu()` do not dispatch such an
operator on the CPU: not seen here.)"""


# unikv's own bounds check of a KV write on CPU tensors (`KVViews.write`, `s.device.type == "cpu"`): not on CUDA
CPU_ONLY_READS = {"unikv/tensors/kv.py:write"}


# torch's own package directory: a frame inside it is torch's, a frame of a package installed beside it
# (transformers in /opt/torch/.venv/..., as on the H200) is not
TORCH_DIR = str(Path(torch.__file__).parent) + "/"


class HostReads:
    """Records the `HOST_READS` operators run inside `with HostReads() as
    reads:` as (operator, "file:function" of the innermost caller outside
    torch) in `reads.seen`."""

    def __enter__(self):
        import traceback

        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.seen = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func._schema.name in HOST_READS:
                    frame = next(f for f in reversed(traceback.extract_stack()[:-1])
                                 if not f.filename.startswith(TORCH_DIR))
                    path = frame.filename
                    for root in ("transformers/", "unikv/", "sim/"):
                        if root in path:
                            path = path[path.rfind(root):]
                            break
                    seen.append((func._schema.name, f"{path}:{frame.name}"))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def watch_graph_steps(ex, seen: list, *, poison: bool, host_reads: list | None = None) -> None:
    """Wrap the executor's decode graphs: each step a bucket runs appends
    (requests, bucket) to `seen`, and after it every occupied slot of the
    state band other than the step's requests' must hold the bytes it held
    before (so padding rows wrote no live slot) and the requests' slots
    finite state, and the bucket's cache must keep its state tensors where
    they were (what a captured graph reads and writes: transformers'
    one-token paths update them in place). With `poison`, slot PAD_SLOT
    (the padding rows' slot) is filled with NaN before each step: a live row that read it, or a
    padding row's state written to a live slot, would turn a request's
    state NaN and change its tokens. `host_reads`: the `HOST_READS`
    operators each bucket forward (what a capture records: gather,
    forward, scatter) ran are appended to it."""
    from unikv.sim.real.state import PAD_SLOT, conv_state, recurrent_state

    graphs, pool, band = ex.graphs, ex.mem.pool, ex.state_band
    entry = pool.layout.geometry(band).band.entry_bytes
    tensors = [ex.binder.views.get(g.layer, name) for g in ex.binder.layers
               for name in (("conv", "ssm") if g.ssm_shape is not None else ("conv",))]
    run, forward = graphs.run, graphs._forward
    if host_reads is not None:
        def reading_forward(st, *args, **kwargs):
            with HostReads() as reads:
                out = forward(st, *args, **kwargs)
            host_reads.extend(reads.seen)
            return out

        graphs._forward = reading_forward
    addresses: dict[int, list[int]] = {}  # bucket -> its cache's state tensors' addresses

    def cache_addresses(n: int) -> list[int]:
        cache = graphs._buckets[n].cache
        return [f(cache, g.layer).data_ptr() for g in ex.binder.layers for f in (conv_state, recurrent_state)
                if g.ssm_shape is not None or f is conv_state]

    def watched(batch, state_slots=None):
        if poison:
            for t in tensors:
                t[PAD_SLOT] = float("nan")
        before = torch.as_tensor(pool.buffer_view(band)).clone()
        picks = run(batch, state_slots)
        if picks is None:
            return picks
        b = len(batch.requests)
        seen.append((b, graphs.bucket(b)))
        assert addresses.setdefault(seen[-1][1], cache_addresses(seen[-1][1])) == cache_addresses(seen[-1][1])
        occupied = pool.occupancy()["bands"][band]
        lo, hi = occupied["low_byte"] // entry, occupied["high_byte"] // entry
        assert lo > PAD_SLOT
        after = torch.as_tensor(pool.buffer_view(band))
        changed = {lo + int(i) for i in torch.nonzero((after[lo:hi] != before[lo:hi]).any(dim=1)).flatten()}
        assert changed <= {int(x) for x in state_slots}, (changed, list(state_slots))
        idx = torch.as_tensor(state_slots, device=tensors[0].device)
        assert all(bool(torch.isfinite(t[idx]).all()) for t in tensors)
        return picks

    graphs.run = watched


# the graphs' replay: 24 requests (outputs 8-29), one every ms, up to 24 running and 256 prefill tokens a
# step, under budgets where 16 and more decode together, a slot moves and requests are retracted mid-generation
GRAPH_CASES = [("nemotron_h", "lazy", 400_000), ("lfm2", "eager", 150_000), ("nemotron_moe", "lazy", 400_000)]
GPU = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"), pytest.mark.gpu]


# nemotron_moe in fp32 on CUDA: torch's grouped_mm falls back to a loop over offs.cpu(), which no capture holds
# (`test_a_moe_hybrids_fp32_experts_on_cuda_decode_eagerly_saying_why`); the real model runs bf16 and captures
@pytest.mark.parametrize("name,compaction,budget_bytes,device", [(*c, "cpu") for c in GRAPH_CASES]
                         + [pytest.param(*c, "cuda", marks=GPU) for c in GRAPH_CASES if c[0] != "nemotron_moe"])
def test_decode_graphs_of_a_hybrid_give_transformers_greedy_tokens_and_pad_only_the_sink_slot(
        tmp_path, monkeypatch, one_thread, name, compaction, budget_bytes, device):
    """With `decode_graphs` a hybrid's decoders run through the buckets'
    static buffers, the Mamba-2 state updated in its slots and LFM2's
    gathered and scattered inside them (captured on CUDA; uncaptured
    here): every request's tokens equal transformers'
    greedy `generate` with its own cache (as the eager path's do,
    `test_a_hybrids_replay_...`) with 16 and more requests decoding
    together, steps were padded to their bucket, and no padding row
    touched a live slot (`watch_graph_steps`, the padding slot poisoned
    with NaN before every step). On CUDA every bucket is captured (the
    forward, with LFM2 the gather before it and the scatter after, in one
    graph) and replayed."""
    seen: list[tuple[int, int]] = []
    reads: list[str] = []
    res, ex, retracted_at, _ = replay(tmp_path, monkeypatch, compaction, name=name, budget_gib=budget_bytes / 2**30,
                                      graphs=True, on_build=lambda ex: watch_graph_steps(ex, seen, poison=True,
                                                                                         host_reads=reads),
                                      requests=trace(24, (8, 30), 0.001), running=24, prefill_tokens=256,
                                      device=device)
    assert res.violations == [] and ex.graphs is not None and "graph_off" not in res.summary
    assert res.summary["graph_steps"] == len(seen) > 0 and res.summary["graph_capture_failures"] == {}
    # Mamba-2 mixers update their state in the slots (sim.real.slot_decode); LFM2's short conv gathers it
    assert (res.summary["graph_state"] == "in slot") == (name != "lfm2"), res.summary["graph_state"]
    captured = res.summary["graph_captured"]
    assert captured == (sorted({n for _, n in seen}) if device == "cuda" else [])
    if device == "cpu":  # on CUDA the captured steps replay without Python: only the capture's forward runs it
        assert {where for _, where in reads} <= CPU_ONLY_READS, f"host reads in a bucket forward: {set(reads)}"
    assert sum(b < n for b, n in seen) >= 10, f"too few steps padded to their bucket: {seen}"
    assert max(b for b, _ in seen) >= 16 and {1, 4, 8, 16} <= {n for _, n in seen}
    assert any(g > 0 for g in retracted_at) and ex.mem.pool.stats()["bands"]["mamba"]["moves"] > 0
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=GPU)])
def test_a_moe_hybrids_fp32_experts_on_cuda_decode_eagerly_saying_why(tmp_path, monkeypatch, one_thread, device):
    """On CUDA, torch's grouped_mm runs a kernel only for bfloat16 weights
    (compute capability 9.x / 10.x) and otherwise copies its offsets to the
    host (the H200 run: "Cannot copy between CPU and CUDA tensors during
    CUDA graph capture" in every bucket): `DecodeGraphs` refuses such a
    model up front, the executor decodes it eagerly, the summary's
    `graph_off` says why, and the tokens are still transformers'."""
    name, compaction, budget_bytes = next(c for c in GRAPH_CASES if c[0] == "nemotron_moe")
    res, ex, _, _ = replay(tmp_path, monkeypatch, compaction, name=name, budget_gib=budget_bytes / 2**30,
                           graphs=True, requests=trace(24, (8, 30), 0.001), running=24, prefill_tokens=256,
                           device=device)
    assert res.violations == [] and ex.graphs is None and "graph_steps" not in res.summary
    assert "grouped_mm runs its CUDA kernel only for bfloat16 weights" in res.summary["graph_off"]
    assert "torch.float32" in res.summary["graph_off"]
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


def test_grouped_mm_experts_are_a_capture_hazard_on_cuda_unless_bf16_on_sm90_or_sm100(monkeypatch):
    """`capture_hazard`'s grouped_mm rule (torch's `_grouped_mm_cuda`: the
    CUTLASS kernel for bf16 on 9.x / 10.x, else `offs.cpu()`), on stand-in
    weights: CPU weights never; CUDA bf16 on 9.0 and 10.0 not; fp32 on 9.0
    or bf16 on 8.0 named, with the dtype and capability."""
    from types import SimpleNamespace

    from unikv.sim.real.graphs import _grouped_mm_hazard

    class Experts:
        def __init__(self, device: str, dtype):
            self.w = SimpleNamespace(dim=lambda: 3, device=torch.device(device), dtype=dtype)

        def parameters(self):
            return iter([SimpleNamespace(dim=lambda: 1), self.w])

    capability = {"now": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability["now"])
    assert _grouped_mm_hazard(Experts("cpu", torch.float32)) is None
    assert _grouped_mm_hazard(Experts("cuda", torch.bfloat16)) is None
    why = _grouped_mm_hazard(Experts("cuda", torch.float32))
    assert why.startswith("Experts: torch's grouped_mm") and "(here torch.float32, 9.x)" in why
    capability["now"] = (10, 0)
    assert _grouped_mm_hazard(Experts("cuda", torch.bfloat16)) is None
    capability["now"] = (8, 0)
    assert "(here torch.bfloat16, 8.x)" in _grouped_mm_hazard(Experts("cuda", torch.bfloat16))


def test_decode_graphs_refused_for_a_model_run_eagerly_and_the_summary_says_why(tmp_path, monkeypatch, one_thread):
    """A `DecodeGraphs` that refuses the model (as it does a capture of
    transformers' eager MoE loop, below) leaves decode eager: the tokens
    are transformers', and the summary's `graph_off` gives the reason."""
    from unikv.sim.real import graphs as graphs_module

    class Refusing(graphs_module.DecodeGraphs):
        def __init__(self, *args, **kwargs):
            raise ValueError("DecodeGraphs: refused for this test")

    monkeypatch.setattr(graphs_module, "DecodeGraphs", Refusing)
    res, ex, _, _ = replay(tmp_path, monkeypatch, "lazy", name="lfm2", budget_gib=BUDGETS["lfm2"], graphs=True)
    assert ex.graphs is None and "graph_steps" not in res.summary
    assert res.summary["graph_off"] == "decode runs eagerly: DecodeGraphs: refused for this test"
    want = references(ex.model, ex, res.requests)
    assert all(ex.generated[rid] == want[rid] for rid in want)


def test_a_capture_of_transformers_eager_moe_loop_is_refused_naming_its_line(tmp_path):
    """transformers' eager experts loop (`NemotronHExperts.forward`) reads
    the device (`.nonzero()`, `.item()`): with capture on and a state
    binder, `DecodeGraphs` refuses the model in one line naming the
    function, file and line;
    grouped_mm (transformers' default where it dispatches) syncs nowhere
    and is taken, and without capture (the CPU) the eager loop runs."""
    from unikv.sim.real import model as real_model
    from unikv.sim.real.graphs import DecodeGraphs, capture_hazard

    lm = real_model.build_model(config_file(tmp_path, "nemotron_moe"), dtype="fp32", device="cpu", seed=0)
    binder = object()  # the constructor only keeps it: the buckets are not built here
    assert lm.config._experts_implementation == "grouped_mm" and capture_hazard(lm) is None
    DecodeGraphs(lm, None, ["full"], device="cpu", max_pages=4, capture=True, binder=binder)
    lm.set_experts_implementation("eager")
    with pytest.raises(ValueError, match=r"^DecodeGraphs: NemotronHExperts\.forward \(transformers/models/nemotron_h/"
                                         r"modeling_nemotron_h\.py:\d+: `[^`\n]*\.(nonzero|item)\(\)[^\n]*$"):
        DecodeGraphs(lm, None, ["full"], device="cpu", max_pages=4, capture=True, binder=binder)
    DecodeGraphs(lm, None, ["full"], device="cpu", max_pages=4, capture=False, binder=binder)
    moe = next(m for m in lm.modules() if type(m).__name__ == "NemotronHMoE")  # the detector the replay test uses
    hidden = torch.randn(4, 1, lm.config.hidden_size)
    with torch.inference_mode(), HostReads() as eager:
        moe(hidden)
    lm.set_experts_implementation("grouped_mm")
    with torch.inference_mode(), HostReads() as grouped:
        moe(hidden)
    experts = "transformers/models/nemotron_h/modeling_nemotron_h.py:forward"
    assert {("aten::nonzero", experts), ("aten::item", experts)} <= set(eager.seen)
    assert grouped.seen == []
    # without a binder (attention-only models): a failed capture stays recorded per bucket, as before
    DecodeGraphs(lm, None, ["full"], device="cpu", max_pages=4, capture=True)


def test_unikv_replay_of_a_bundled_slice_with_a_hybrid_writes_the_cost_replays_tables(tmp_path, one_thread):
    """`unikv replay --executor real` on a Nemotron-H in bf16 (its state
    band as the config reader sizes it: conv bf16, SSM fp32, as the model
    keeps them) writes the usual files; with the cost clock its steps and
    requests equal a cost-model replay's, and its summary holds the cost
    replay's columns plus the executor's, the state binding's time included."""
    from tests.sim.real.replays import real_and_cost_replays, replay_args

    common = replay_args(config_file(tmp_path), 40, "0.0001", "bf16", "--no-prefix-cache")
    real, cost = real_and_cost_replays(tmp_path, common,
                                       ["--executor", "real", "--dtype", "bf16", "--real-clock", "cost"])
    got, want = real["summary"], cost["summary"]
    assert set(want) < set(got) and got["executor"] == "real" and got["real_state_s_total"] > 0
