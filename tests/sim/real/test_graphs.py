"""DecodeGraphs' static buffers: each step's batch, and padding everywhere else."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unikv.sim.real.graphs import DecodeGraphs  # noqa: E402


def batch(rng, b: int, width: int) -> SimpleNamespace:
    def ints(*shape):
        return torch.from_numpy(rng.integers(1, 1000, shape).astype(np.int64))

    rows = ints(b, width)
    for i in range(b):  # a request's pages end somewhere before the width: 0 past them
        rows[i, int(rng.integers(1, width + 1)):] = 0
    return SimpleNamespace(input_ids=ints(b, 1), position_ids=ints(b, 1), seq_lens=ints(b).to(torch.int32),
                           page_rows=rows, write_vids=ints(b))


def test_each_fill_leaves_the_batch_and_padding_only_whatever_the_steps_before_held():
    """Batches of growing and shrinking size and width through one bucket:
    after every fill the buffers equal the batch in `[:b, :width]` and the
    padding (token 0, position 0, KV length 1, virtual row 0, virtual id 0:
    the sink; state slot PAD_SLOT, in the sink too) everywhere else, though
    a fill only resets what the last one left live."""
    from unikv.sim.real.state import PAD_SLOT

    rng = np.random.default_rng(0)
    graphs = DecodeGraphs(None, None, ["full"], device="cpu", max_pages=9, capture=False)
    st = graphs._static(8)
    st.slots = torch.full((8,), PAD_SLOT, dtype=torch.int64)  # as a binder's bucket holds them
    for _ in range(60):
        b, width = int(rng.integers(1, 9)), int(rng.integers(1, 10))
        x = batch(rng, b, width)
        slots = torch.from_numpy(rng.permutation(np.arange(1, 20))[:b])
        graphs._fill(st, x, b, width, slots)
        assert torch.equal(st.slots[:b], slots) and bool((st.slots[b:] == PAD_SLOT).all())
        assert torch.equal(st.ids[:b], x.input_ids) and not st.ids[b:].any()
        assert torch.equal(st.pos[:b], x.position_ids) and not st.pos[b:].any()
        assert torch.equal(st.seq_lens[:b], x.seq_lens) and bool((st.seq_lens[b:] == 1).all())
        assert torch.equal(st.vids[:b], x.write_vids) and not st.vids[b:].any()
        assert torch.equal(st.rows[:b, :width], x.page_rows)
        assert not st.rows[:b, width:].any() and not st.rows[b:].any()


# -- the compiled decode step (DecodeGraphs(compile=True)) against transformers' own cache --

PS, WINDOW, VOCAB = 4, 6, 96
PROMPTS = (5, 9, 3)
# which requests decode at each step: bucket 4 with a padding row, then 2, 4 again, 1, 4 again
SCHEDULE = ((0, 1, 2), (0, 1, 2), (0, 2), (0, 1, 2), (1,), (0, 1, 2))


def gemma3():
    """A 3-layer fp32 Gemma-3 text model (window and full layers), seeded weights."""
    import transformers

    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=16, vocab_size=VOCAB,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], hidden_size=64,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
        # small embeddings (Gemma scales them by sqrt(hidden)): the attention over the
        # earlier tokens, not the newest token alone, decides the next token
        model.model.embed_tokens.weight.normal_(0.0, 0.05)
    return model


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy decoding of one request with its own DynamicCache (eager attention)."""
    import inspect

    from transformers import DynamicCache

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kw = {key: DynamicCache(config=model.config), "use_cache": True}
    dev = model.device
    out = model(input_ids=torch.tensor([prompt], device=dev), **kw)
    tokens: list[int] = []
    for _ in range(n):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=dev), **kw)
    return tokens


def pool_and_views(layers, device: str = "cpu", pages: int = 120):
    """A fresh two-band pool of `pages` pages of PS tokens (window band up,
    full band down) on `device` (a CUDA pool there, a materialised sim
    pool on the CPU) and its KV views."""
    from unikv import Band, Layout, UnifiedPool
    from unikv.backends import CudaBackend, SimBackend
    from unikv.tensors import KVViews

    bands, blocks = layers.band_bytes(), layers.band_blocks()
    layout = Layout(total_bytes=pages * PS * max(bands.values()), bands=[
        Band(n, entry_bytes=bands[n], grow=g, page_size=PS, blocks_per_page=blocks[n])
        for n, g in (("swa", "up"), ("full", "down"))])
    backend = CudaBackend(device) if device == "cuda" else SimBackend(materialize=True)
    pool = UnifiedPool(layout, backend=backend, compaction="lazy")
    if device == "cuda":
        # a CUDA buffer starts as torch.empty's bytes (NaN among them), the sim buffer as zeros: tests that
        # compare two pools' bytes need both to start known
        pool.buffer.zero_()
    return pool, KVViews(pool, layers.kv)


class Decoding:
    """The requests in a fresh pool: prefilled eagerly, then decoded by `graphs` per SCHEDULE."""

    def __init__(self, model, layers, device: str, pages: int = 300, **graph_options) -> None:
        from unikv.sim.real.graphs import DecodeGraphs

        self.pool, self.views = pool_and_views(layers, device, pages)
        self.model, self.device = model, device
        # on CUDA the buckets are captured as graphs (after the compiling forward)
        self.graphs = DecodeGraphs(model, self.views, self.views.bands, device=device, max_pages=8, **graph_options)

    def run(self, prompts: list[list[int]]) -> list[list[int]]:
        """Each request's generated tokens (the prefill's, then one per scheduled decode)."""
        from unikv.sim.real.attention import StepContext, use_step

        n, dev = len(prompts), self.device
        self.vids = [np.asarray(v) for v in np.split(np.asarray(self.pool.alloc_extend(
            np.zeros(n, np.int64), np.array([len(p) for p in prompts]), np.zeros(n, np.int64))),
            np.cumsum([len(p) for p in prompts])[:-1])]
        ctx = StepContext(
            views=self.views, block_tables={b: self.views.block_table(self.pages(range(n)), b)
                                            for b in self.views.bands},
            cu_q=torch.tensor(np.cumsum([0] + [len(p) for p in prompts]), dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([len(p) for p in prompts], dtype=torch.int32, device=dev),
            write_slots={b: torch.as_tensor(self.pool.translate(np.concatenate(self.vids), b), device=dev)
                         for b in self.views.bands})
        flat = [t for p in prompts for t in p]
        with use_step(ctx), torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([flat], device=dev), position_ids=torch.tensor(
                [[i for p in prompts for i in range(len(p))]], device=dev), use_cache=False).logits[0]
        out = [[int(logits[end - 1].argmax())] for end in np.cumsum([len(p) for p in prompts])]
        for rows in SCHEDULE:
            picks = self.decode(rows, [out[r][-1] for r in rows])
            for r, t in zip(rows, picks.tolist()):
                out[r].append(t)
        return out

    def pages(self, rows) -> list[np.ndarray]:
        return [self.vids[r][::PS] // PS for r in rows]

    def decode(self, rows: tuple[int, ...], last: list[int]) -> torch.Tensor:
        """One decode step of the requests `rows` (their newest tokens `last`) through the graphs."""
        seq = np.array([len(self.vids[r]) + 1 for r in rows])
        new = np.asarray(self.pool.alloc_decode(seq, np.array([self.vids[r][-1] for r in rows])))
        for r, v in zip(rows, new):
            self.vids[r] = np.append(self.vids[r], v)
        self.pool.commit()  # the step's table changes to the device tables the graph reads, as build_batch does
        pages = self.pages(rows)
        width = max(len(p) for p in pages)
        page_rows = torch.zeros((len(rows), width), dtype=torch.int64)
        for i, p in enumerate(pages):
            page_rows[i, :len(p)] = torch.from_numpy(p)
        dev = self.device
        batch = SimpleNamespace(layout="padded", requests=rows, page_rows=page_rows.to(dev),
                                input_ids=torch.tensor(last, device=dev).view(-1, 1),
                                position_ids=torch.tensor(seq - 1, device=dev).view(-1, 1),
                                seq_lens=torch.tensor(seq, dtype=torch.int32, device=dev),
                                write_vids=torch.from_numpy(new).to(dev))
        with torch.inference_mode():
            return self.graphs.run(batch).cpu()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[CUDA, pytest.mark.gpu])]


@pytest.fixture(scope="module", params=DEVICES)
def tiny(request):
    """The model on the device, its layers and the prompts, with transformers'
    greedy tokens of each request."""
    pytest.importorskip("transformers")
    from unikv.sim.real.attention import register
    from unikv.sim.real.layers import model_layers

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = gemma3().to(request.param)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, VOCAB, size=p).tolist() for p in PROMPTS]
    counts = [1 + sum(r in rows for rows in SCHEDULE) for r in range(len(PROMPTS))]
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        want = [greedy(model, p, c) for p, c in zip(prompts, counts)]
    model.set_attn_implementation(register(mask=False))
    yield request.param, model, model_layers(model.config, torch.float32), prompts, want
    torch.set_num_threads(before)


@pytest.mark.parametrize("options", [
    pytest.param({}, id="eager"),
    pytest.param({"compile": True, "compile_backend": "aot_eager"}, id="aot_eager"),
    # inductor's C++ code generation takes about a minute on a 2-core CPU: slow there
    pytest.param({"compile": True}, id="inductor", marks=pytest.mark.slow)])
def test_decode_steps_give_transformers_greedy_tokens_compiled_or_not(tiny, options):
    """Decode steps of 3, 2 and 1 requests through buckets 4 (one padding
    row), 2, 4 again, 1 and 4 again: every request's tokens equal
    transformers' greedy run with its own cache, compiled (dynamo +
    AOTAutograd, with and without inductor's code) or not; on CUDA every
    bucket is captured as a graph (of the compiled forward, with compile).
    Four compiled graphs (two layer kinds, two shape classes) serve every
    layer, bucket and pool."""
    from torch._dynamo.utils import counters

    device, model, layers, prompts, want = tiny
    compiled = []
    for pages in (300, 420):  # a second pool of another size: no new compile
        before = counters["stats"]["unique_graphs"]
        run = Decoding(model, layers, device, pages, **options)
        assert run.run(prompts) == want
        compiled.append(counters["stats"]["unique_graphs"] - before)
        stats = run.graphs.stats()
        assert stats["buckets"] == [1, 2, 4] and stats["steps"] == len(SCHEDULE)
        assert stats["captured"] == ([1, 2, 4] if device == "cuda" else []) and stats["failures"] == {}
        if options:
            assert stats["compile_failures"] == {} and stats["compiled"] == [1, 2, 4]
            assert set(stats["compile_s"]) == {1, 2, 4}
        assert run.pool.verify() == []
        for layer in model.model.layers:  # the model as it was: no compiled forward, no reference to the pool
            assert "forward" not in vars(layer) and not hasattr(layer.self_attn, "unikv_cache")
    # compiled: one graph per layer kind (window, full) for bucket 4 (dynamic batch) and bucket 1
    # (static); the second window layer, bucket 2 and the second pool reuse them
    assert compiled == ([4, 0] if options else [0, 0])


def test_fused_projections_decode_transformers_greedy_tokens_compiled(tiny):
    """The model with q/k/v and gate/up fused (`sim.real.fuse`), compiled and
    (on CUDA) captured: transformers' greedy tokens still."""
    import copy

    from unikv.sim.real.fuse import fuse_projections

    device, model, layers, prompts, want = tiny
    fused = copy.deepcopy(model)
    assert fuse_projections(fused)["attention"] == len(model.model.layers)
    run = Decoding(fused, layers, device, compile=True, compile_backend="aot_eager")
    assert run.run(prompts) == want
    stats = run.graphs.stats()
    assert stats["compile_failures"] == {} and stats["compiled"] == [1, 2, 4]


def test_a_compile_that_fails_is_recorded_and_the_bucket_runs_uncompiled(tiny):
    """A backend that raises: each bucket records the error and decodes
    uncompiled, with transformers' tokens still."""
    device, model, layers, prompts, want = tiny

    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    run = Decoding(model, layers, device, compile=True, compile_backend=broken)
    assert run.run(prompts) == want
    stats = run.graphs.stats()
    assert stats["compiled"] == [] and sorted(stats["compile_failures"]) == [1, 2, 4]
    assert all("this backend cannot compile" in why for why in stats["compile_failures"].values())
    assert stats["captured"] == ([1, 2, 4] if device == "cuda" else [])


def test_a_compile_mode_that_captures_graphs_itself_is_refused():
    with pytest.raises(ValueError, match="compile_mode='reduce-overhead' captures CUDA graphs itself"):
        DecodeGraphs(None, None, ["full"], device="cpu", max_pages=4, compile=True, compile_mode="reduce-overhead")


def test_a_compiled_forward_that_fails_to_capture_is_recorded_and_the_uncompiled_one_captured(tiny, monkeypatch):
    """The capture path's fallback, on any device: the capture is stubbed
    (it refuses the compiled forward, as a capture that hits a sync would,
    and records the uncompiled one), the side stream is the current one."""
    import contextlib

    from unikv.sim.real import graphs as graphs_module

    device, model, layers, prompts, want = tiny
    captured = []

    def capture(self, st):
        if st.compiled:
            raise RuntimeError("operation not permitted when stream is capturing")
        captured.append(st.ids.shape[0])

    monkeypatch.setattr(graphs_module.DecodeGraphs, "_capture", capture)
    monkeypatch.setattr(graphs_module, "side_stream", lambda device: contextlib.nullcontext())
    run = Decoding(model, layers, device, compile=True, compile_backend="aot_eager")
    run.graphs.capture = True
    run.graphs.capture_buckets(2)
    stats = run.graphs.stats()
    assert captured == [1, 2] and stats["compiled"] == [] and set(stats["compile_s"]) == {1, 2}
    assert stats["compile_failures"] == {n: "capture: RuntimeError: operation not permitted when stream is capturing"
                                         for n in (1, 2)}


def test_a_model_without_decoder_layers_is_recorded_and_runs_uncompiled():
    graphs = DecodeGraphs(torch.nn.Linear(2, 2), None, ["full"], device="cpu", max_pages=4, capture=False,
                          compile=True)
    graphs.capture_buckets(2)
    stats = graphs.stats()
    assert stats["compiled"] == [] and stats["compile_s"] == {}
    assert stats["compile_failures"] == {n: "ValueError: CompiledLayers: Linear has no decoder layers with a "
                                            "self_attn module (get_decoder().layers[i].self_attn.layer_idx), nor "
                                            "a hybrid's blocks (an attention, recurrent or MLP / MoE mixer each: "
                                            "sim.real.hybrid)"
                                         for n in (1, 2)}
