"""A hybrid's prefill chunk padded to a token bucket (`sim.real.padded_chunk`,
`PackedGraphs` with the state binder).

The mixer-level tests run one Nemotron-H Mamba-2 mixer (Nemotron-H-56B's
config trimmed as in `test_hybrid_replay.py`, whose `time_step_limit`
starts at 0.001, not 0) on chunks padded with random rows and compare it
with transformers' own forward of the unpadded chunks: the real rows and
the conv and SSM state after each chunk must agree to fp32 rounding. The
replays run the executor with `prefill_graphs` and compare every token with
transformers' greedy `generate`.
"""

from __future__ import annotations

import inspect
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim.real import executor as real_executor  # noqa: E402
from unikv.sim.real.mixers import served_mixers  # noqa: E402
from unikv.sim.real.padded_chunk import (  # noqa: E402
    ChunkLength,
    carry,
    padded_forward,
    padded_ready,
)
from unikv.sim.real.ssd import kernel_chunk_scan  # noqa: E402
from unikv.sim.real.state import PAD_SLOT, conv_state, recurrent_state  # noqa: E402

from tests.sim.real.test_hybrid_replay import (  # noqa: E402
    BUDGETS,
    CPU_ONLY_READS,
    LFM2,
    SOURCE,
    TRIM,
    HostReads,
    references,
    replay,
    trace,
)

CUDA = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"), pytest.mark.gpu]


@pytest.fixture(scope="module")
def mixer():
    """(the model, its first Mamba-2 mixer, the mixer's cache keyword)."""
    raw = json.loads(SOURCE.read_text()) | TRIM
    raw.pop("auto_map", None)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**raw)).eval()
    m = next(x for x in model.modules() if type(x).__name__ == "NemotronHMamba2Mixer")
    kwarg = "cache" if "cache" in inspect.signature(m.forward).parameters else "cache_params"
    return model, m, kwarg


def chunks_of(sizes, hidden: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, hidden, generator=g) for n in sizes]


def transformers_run(model, m, kwarg, chunks):
    """transformers' own forward of each chunk with its own cache (the
    scan swapped for unikv's, `kernel_chunk_scan`, so both sides scan alike):
    (outputs, conv state, SSM state)."""
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode(), kernel_chunk_scan():
        outs = [m(h, **{kwarg: cache}) for h in chunks]
    return outs, conv_state(cache, m.layer_idx), recurrent_state(cache, m.layer_idx)


def padded_run(model, m, kwarg, chunks, bucket: int, *, poison: float = float("nan"), fresh=None):
    """Each chunk padded with random rows to `bucket` tokens through
    `served_mixers`, the cache's state starting as `poison` (a first chunk
    must not read it): (outputs at the real rows, conv state, SSM state)."""
    cache = transformers.DynamicCache(config=model.config)
    k = m.conv_kernel_size
    cache.update_conv_state(torch.full((1, m.conv_dim, k), poison), m.layer_idx, conv_kernel_size=k)
    cache.update_recurrent_state(torch.full((1, m.num_heads, m.head_dim, m.ssm_state_size), poison), m.layer_idx)
    outs = []
    g = torch.Generator().manual_seed(7)
    with torch.inference_mode(), served_mixers(model):
        for i, h in enumerate(chunks):
            n = h.shape[1]
            pad = torch.randn(1, bucket - n, h.shape[2], generator=g)
            first = i == 0 if fresh is None else fresh[i]
            carry(cache, ChunkLength(torch.tensor([n]), torch.tensor([first])))
            outs.append(m(torch.cat([h, pad], dim=1), **{kwarg: cache})[:, :n])
    return outs, conv_state(cache, m.layer_idx), recurrent_state(cache, m.layer_idx)


@pytest.mark.parametrize("sizes,bucket", [((5, 13, 1, 9), 24), ((16, 16), 16), ((3,), 48), ((8, 7), 8)])
def test_a_padded_chunk_gives_the_unpadded_rows_and_state(mixer, sizes, bucket):
    """First, continuing and one-token chunks, padded by 0 to 45 rows across
    scan-chunk boundaries (the model's scan chunk is 8 tokens): every real
    row and the state after every chunk are transformers' (fp32 rounding)."""
    model, m, kwarg = mixer
    assert m.time_step_limit[0] > 0  # the clamp that makes a padding token's dt' nonzero unless masked after it
    chunks = chunks_of(sizes, model.config.hidden_size)
    want, got = transformers_run(model, m, kwarg, chunks), padded_run(model, m, kwarg, chunks, bucket)
    for a, b in zip(want[0], got[0]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1][..., 1:], want[1][..., 1:], rtol=1e-5, atol=1e-6)  # in_proj over T rows
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-8)


def test_control_a_chunk_read_to_the_buckets_end_changes_the_state(mixer, monkeypatch):
    """Control: the same padded chunks with the length set to the bucket's
    (padding rows counted as real) leave another conv and SSM state."""
    import unikv.sim.real.padded_chunk as pc

    model, m, kwarg = mixer
    chunks = chunks_of((5, 13), model.config.hidden_size)
    want = transformers_run(model, m, kwarg, chunks)
    real = pc.padded_forward

    def whole_length(mixer_, hidden, cache, chunk, attention_mask=None):
        return real(mixer_, hidden, cache, ChunkLength(torch.tensor([hidden.shape[1]]), chunk.fresh),
                    attention_mask)

    monkeypatch.setattr(pc, "padded_forward", whole_length)
    got = padded_run(model, m, kwarg, chunks, 24)
    assert not torch.allclose(got[1][..., 1:], want[1][..., 1:], rtol=1e-3, atol=1e-5)
    assert not torch.allclose(got[2], want[2], rtol=1e-3, atol=1e-6)


def test_the_fresh_flag_ignores_the_gathered_state_and_a_cleared_one_reads_it(mixer):
    """A first chunk starts from zero whatever its slot held (NaN here); a
    continuing chunk reads the state (the NaN reaches its rows)."""
    model, m, kwarg = mixer
    chunks = chunks_of((6,), model.config.hidden_size)
    first = padded_run(model, m, kwarg, chunks, 16, fresh=[True])
    assert all(bool(torch.isfinite(t).all()) for t in (first[0][0], first[1][..., 1:], first[2]))
    stale = padded_run(model, m, kwarg, chunks, 16, fresh=[False])
    assert bool(torch.isnan(stale[0][0]).any())


def test_outside_a_padded_chunk_transformers_forward_runs_and_the_class_is_restored(mixer):
    model, m, kwarg = mixer
    cls = type(m)
    own = cls.__dict__["forward"]
    h = chunks_of((5,), model.config.hidden_size)[0]
    with torch.inference_mode():
        want = m(h, **{kwarg: transformers.DynamicCache(config=model.config)})
        with served_mixers(model):
            assert cls.forward is not own
            got = m(h, **{kwarg: transformers.DynamicCache(config=model.config)})  # no ChunkLength: transformers'
    assert cls.__dict__["forward"] is own
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bad_calls_are_refused_in_one_line(mixer):
    model, m, kwarg = mixer
    cache = transformers.DynamicCache(config=model.config)
    chunk = ChunkLength(torch.tensor([3]), torch.tensor([True]))
    with pytest.raises(ValueError, match="a batch of 2 .* expected one padded chunk"):
        padded_forward(m, torch.zeros(2, 4, model.config.hidden_size), cache, chunk)
    with pytest.raises(ValueError, match="holds no conv / SSM state; expected the state binder's static cache"):
        padded_forward(m, torch.zeros(1, 4, model.config.hidden_size), cache, chunk)


def test_a_short_conv_model_has_no_padded_path_and_its_replay_says_so(tmp_path, monkeypatch, one_thread):
    """LFM2's short-conv layers: PackedGraphs refuses the model by its layer
    class, so its prefill chunks run uncaptured and the summary says why."""
    lm = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**LFM2))
    assert "have no padded chunk path" in padded_ready(lm)
    res, ex, _, _ = replay(tmp_path, monkeypatch, "lazy", name="lfm2", budget_gib=BUDGETS["lfm2"],
                           prefill_graphs=True)
    assert ex.packed is None and res.violations == []
    assert "ShortConv have no padded chunk path" in res.summary["packed_graph_off"]
    assert res.summary["packed_graph_fallbacks"] == int(res.steps["prefill_tokens"].gt(0).sum())


def watch_packed_steps(ex, seen: list, host_reads: list | None) -> None:
    """Wrap the executor's packed graphs: each chunk a bucket runs appends
    (tokens, bucket, fresh) to `seen`; before it the padding slot is
    poisoned with NaN, after it only the chunk's own slot of the state band
    may have changed and its state must be finite; the bucket forward's
    host reads (what a capture records) go to `host_reads` (None: not
    watched; a dispatch mode would stop dynamo compiling the forward)."""
    packed, pool, band = ex.packed, ex.mem.pool, ex.state_band
    entry = pool.layout.geometry(band).band.entry_bytes
    tensors = [ex.binder.views.get(g.layer, name) for g in ex.binder.layers for name in ("conv", "ssm")]
    run, forward = packed.run, packed._forward

    def reading_forward(st, *args, **kwargs):
        with HostReads() as reads:
            out = forward(st, *args, **kwargs)
        host_reads.extend(reads.seen)
        return out

    if host_reads is not None:
        packed._forward = reading_forward

    def watched(batch, state_slots=None, fresh=False):
        for t in tensors:
            t[PAD_SLOT] = float("nan")
        before = torch.as_tensor(pool.buffer_view(band)).clone()
        picks = run(batch, state_slots, fresh)
        if picks is None:
            return picks
        seen.append((batch.num_tokens, packed.bucket(batch.num_tokens), fresh))
        occupied = pool.occupancy()["bands"][band]
        lo, hi = occupied["low_byte"] // entry, occupied["high_byte"] // entry
        after = torch.as_tensor(pool.buffer_view(band))
        changed = {lo + int(i) for i in torch.nonzero((after[lo:hi] != before[lo:hi]).any(dim=1)).flatten()}
        assert changed <= {int(x) for x in state_slots}, (changed, list(state_slots))
        idx = torch.as_tensor(state_slots, device=tensors[0].device)
        assert all(bool(torch.isfinite(t[idx]).all()) for t in tensors), (batch.num_tokens, fresh)
        return picks

    packed.run = watched


@pytest.mark.parametrize("device,compiled", [
    pytest.param("cpu", False, id="cpu-eager"), pytest.param("cpu", True, id="cpu-compiled"),
    pytest.param("cuda", False, id="cuda-eager", marks=CUDA), pytest.param("cuda", True, id="cuda-compiled",
                                                                           marks=CUDA)])
def test_a_hybrid_replay_through_padded_chunk_buckets_gives_transformers_tokens(tmp_path, monkeypatch, one_thread,
                                                                               device, compiled):
    """With `prefill_graphs` every prefill chunk of Nemotron-H (first,
    continuing, readmitted after a retraction) runs through its token
    bucket's buffers, padded (16, 32 and 48-token buckets, up to 47 padding
    rows), its state gathered from its slot and scattered back inside the
    bucket forward; captured on CUDA (compiled with inductor there,
    aot_eager here). The padding slot is poisoned before every chunk and
    only the chunk's own slot changes and holds finite state (the poison
    reaches the padding request's attention through the sink, and from
    there the padding rows: `padded_forward` must keep them out of the
    state); the eager bucket forward reads nothing on the host; every token
    equals transformers' greedy `generate`."""
    from tests.sim.real import test_hybrid_replay

    if compiled:
        monkeypatch.setattr(real_executor, "COMPILE_BACKEND", "aot_eager" if device == "cpu" else "inductor")
        monkeypatch.setitem(test_hybrid_replay.TRIM, "chunk_size", 64)  # fewer graphs to trace on the CPU
        torch._dynamo.reset()
    seen: list[tuple[int, int, bool]] = []
    reads: list = []
    res, ex, retracted_at, continued = replay(
        tmp_path, monkeypatch, "lazy", prefill_graphs=True, compile_prefill=compiled, device=device,
        requests=trace(18, (2, 12)), prefill_tokens=36,
        on_build=lambda ex: watch_packed_steps(ex, seen, None if compiled else reads))
    s = res.summary
    chunks = int(res.steps["prefill_tokens"].gt(0).sum())
    assert res.violations == [] and continued and any(g > 0 for g in retracted_at)
    assert s["packed_graph_steps_captured"] + s["packed_graph_steps_uncaptured"] == len(seen) >= chunks
    assert s["packed_graph_fallbacks"] == 0 and s["packed_graph_capture_failures"] == {}
    assert {16, 32, 48} <= {n for _, n, _ in seen} and any(t < n for t, n, _ in seen)
    assert {True, False} <= {fresh for _, _, fresh in seen}
    if device == "cuda":
        assert s["packed_graph_steps_uncaptured"] == 0 and s["packed_graph_captured"] == s["packed_graph_buckets"]
    elif not compiled:
        assert {where for _, where in reads} <= CPU_ONLY_READS, f"host reads in a bucket forward: {set(reads)}"
    if compiled:
        assert s["prefill_compile_failure"] is None, s["prefill_compile_failure"]
        assert s["packed_graph_compiled"] == s["packed_graph_buckets"]
        # the padded blocks compile once for every bucket (3 graphs here: attention, Mamba-2, MLP blocks)
        assert s["prefill_graphs"] <= 6, s["prefill_graphs"]
    want = references(ex.model, ex, res.requests)
    for rid in want:
        assert ex.generated[rid] == want[rid], f"request {rid}"


def test_the_executor_refuses_packed_graphs_of_another_binder():
    from unikv.sim.real.executor import RealExecutor

    with pytest.raises(ValueError, match="built with another state binder than binder"):
        RealExecutor(None, None, None, None, bands=["full"], packed=object(), binder=object())
