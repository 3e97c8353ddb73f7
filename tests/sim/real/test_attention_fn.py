"""The "unikv" attention function: a batch whose KV lives in the pool gives
the logits transformers' own DynamicCache gives for each request alone.

Small fp32 models with seeded random weights (Llama; Gemma-3 text with
window + full layers; Gemma-2 with logit soft-capping; gpt-oss with sinks
and MoE). Four requests of different prompt lengths: step 1 prefills them
packed `[1, T]` (the longest only its first chunk), step 2 is packed and
mixed (that request's second chunk reads the first chunk's KV from the pool,
the others decode), then padded `[B, 1]` decode steps. Between steps, pages
that left the window are released on the swa band (tombstones -> the sink in
the block table) and a freed filler request lets an urgent flush move live
pages under the views. On the CPU the attention runs the torch reference
(and, for two models, the Triton kernel through Triton's interpreter); on a
CUDA device, the Triton kernel over a `CudaBackend` pool.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # The interpreter cases run the Triton kernel on CPU tensors: Triton must be imported
    # with TRITON_INTERPRET=1 (nothing above imports it; unikv imports it lazily).
    os.environ.setdefault("TRITON_INTERPRET", "1")
import transformers
from unikv.sim.real.attention import StepContext, register, use_step
from unikv.sim.real.layers import model_layers

from unikv import Band, Layout, UnifiedPool
from unikv.backends import CudaBackend, SimBackend
from unikv.kernels.launch import interpreted
from unikv.tensors import KVViews

PS, WINDOW, VOCAB = 4, 6, 96
PROMPTS = (5, 9, 3, 12)
FIRST_CHUNK = 7  # the longest prompt's first chunk (step 1); the rest comes in step 2
DECODES = 3  # padded decode steps after the mixed step
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, **SMALL))


def gemma3():
    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **SMALL)
    return transformers.Gemma3ForCausalLM(cfg)


def gemma2():
    cfg = transformers.Gemma2Config(
        num_hidden_layers=2, sliding_window=WINDOW, query_pre_attn_scalar=16,
        attn_logit_softcapping=0.5, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"], **SMALL)
    return transformers.Gemma2ForCausalLM(cfg)


def gpt_oss():
    cfg = transformers.GptOssConfig(
        num_hidden_layers=2, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], **SMALL)
    model = transformers.GptOssForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # sinks that matter
    return model


def build(factory, device: str = "cpu"):
    torch.manual_seed(0)
    model = factory().float().eval().to(device)
    with torch.no_grad():  # weights big enough that soft-capping and sinks change the result
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


def reference_logits(model, tokens: list[int], prompt: int) -> torch.Tensor:
    """transformers' own cache (eager attention): prefill the prompt, then one token at a time."""
    model.set_attn_implementation("eager")
    cache = transformers.DynamicCache(config=model.config)
    ids = torch.tensor([tokens], device=model.device)
    with torch.no_grad():
        out = [model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True).logits[0]]
        for pos in range(prompt, len(tokens)):
            out.append(model(input_ids=ids[:, pos:pos + 1], past_key_values=cache, use_cache=True).logits[0])
    return torch.cat(out)


class Batch:
    """The requests' virtual ids and lengths in a materialised pool, one step at a time."""

    def __init__(self, model, layers, triton: bool | None = None) -> None:
        bands = layers.band_bytes()
        blocks = layers.band_blocks()
        chain = [("swa", "up"), ("full", "down")] if "swa" in bands else [("full", "down")]
        layout = Layout(total_bytes=600 * PS * max(bands.values()), bands=[
            Band(name, entry_bytes=bands[name], grow=grow, page_size=PS, blocks_per_page=blocks[name])
            for name, grow in chain])
        device = model.device
        backend = CudaBackend(device) if device.type == "cuda" else SimBackend(materialize=True)
        self.pool = UnifiedPool(layout, backend=backend, compaction="lazy")
        self.views = KVViews(self.pool, layers.kv)
        self.model, self.window, self.triton = model, layers.window_tokens, triton
        self.device = device
        self.vids: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in PROMPTS]
        self.released = [0] * len(PROMPTS)

    def step(self, tokens: list[list[int]], news: list[int], layout: str) -> list[torch.Tensor]:
        """One forward of `news[r]` new tokens of each request r; its logits per request."""
        prefix = np.array([len(v) for v in self.vids])
        last = np.array([v[-1] if len(v) else 0 for v in self.vids])
        ids = np.asarray(self.pool.alloc_extend(prefix, prefix + np.array(news), last))
        new, at = [], 0
        for r, n in enumerate(news):
            new.append(ids[at: at + n])
            self.vids[r] = np.concatenate([self.vids[r], ids[at: at + n]])
            at += n
        ctx = self.context(np.concatenate(new), news, layout)
        positions = [range(len(v) - n, len(v)) for v, n in zip(self.vids, news)]
        flat_ids = [tokens[r][p] for r, ps in enumerate(positions) for p in ps]
        flat_pos = [p for ps in positions for p in ps]
        shape = (1, len(flat_ids)) if layout == "packed" else (len(news), 1)
        with use_step(ctx), torch.no_grad():
            logits = self.model(input_ids=torch.tensor(flat_ids, device=self.device).reshape(shape),
                                position_ids=torch.tensor(flat_pos, device=self.device).reshape(shape),
                                use_cache=False).logits
        logits = logits.reshape(-1, logits.shape[-1]).cpu()
        self.release_window()
        return list(torch.split(logits, news))

    def context(self, new_ids: np.ndarray, news: list[int], layout: str) -> StepContext:
        pages = [v[::PS] // PS for v in self.vids]
        dev = self.device
        return StepContext(
            views=self.views,
            block_tables={b: self.views.block_table(pages, b) for b in self.views.bands},
            cu_q=torch.tensor(np.concatenate([[0], np.cumsum(news)]), dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([len(v) for v in self.vids], dtype=torch.int32, device=dev),
            write_slots={b: torch.as_tensor(self.pool.translate(new_ids, b), device=dev)
                         for b in self.views.bands},
            layout=layout, triton=self.triton)

    def release_window(self) -> None:
        """Tombstone on swa each page no later query can see (all positions <= L - window)."""
        if "swa" not in self.views.bands:
            return
        for r, v in enumerate(self.vids):
            while (self.released[r] + 1) * PS - 1 <= len(v) - self.window:
                page = self.released[r]
                self.pool.release(v[page * PS: (page + 1) * PS], band="swa")
                self.released[r] += 1


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CASES = [pytest.param(f, "cpu", None, id=f.__name__) for f in (llama, gemma3, gemma2, gpt_oss)]
CASES += [pytest.param(f, "cpu", True, id=f"{f.__name__}-triton-interpreter") for f in (gpt_oss,)]
CASES += [pytest.param(f, "cuda", None, id=f"{f.__name__}-cuda", marks=[pytest.mark.gpu, CUDA])
          for f in (llama, gemma3, gemma2, gpt_oss)]


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")  # 5.24's name is `cache`; 5.17 has no alias
@pytest.mark.parametrize("factory, device, triton", CASES)
def test_pool_batch_matches_transformers_cache_per_request(factory, device, triton):
    if triton:
        from unikv.kernels.attention import kernel

        if not interpreted(kernel._attention_kernel):
            pytest.skip("Triton was imported without TRITON_INTERPRET=1: no kernel on CPU tensors")
    model = build(factory, device)
    rng = np.random.default_rng(1)
    steps = 1 + DECODES  # the mixed step, then the padded decodes
    tokens = [rng.integers(0, VOCAB, size=p + steps).tolist() for p in PROMPTS]
    want = [reference_logits(model, t, p).cpu() for t, p in zip(tokens, PROMPTS)]

    model.set_attn_implementation(register())
    layers = model_layers(model.config, torch.float32)
    batch = Batch(model, layers, triton)
    filler = batch.pool.alloc(8 * PS)  # freed after the prefill: the flush then moves live pages
    got: list[list[torch.Tensor]] = [[] for _ in PROMPTS]
    first = [min(p, FIRST_CHUNK) for p in PROMPTS]
    for r, out in enumerate(batch.step(tokens, first, "packed")):
        got[r].append(out)
    batch.pool.free(filler)
    moved = batch.pool.flush(urgent=True)
    second = [p - f if p > f else 1 for p, f in zip(PROMPTS, first)]  # chunk 2, or a decode
    for r, out in enumerate(batch.step(tokens, second, "packed")):
        got[r].append(out)
    for _ in range(DECODES - 1):
        for r, out in enumerate(batch.step(tokens, [1] * len(PROMPTS), "padded")):
            got[r].append(out)
    assert moved > 0 and batch.pool.stats()["moves"] > 0
    if layers.window_tokens is not None:
        assert sum(batch.released) > 0  # tombstoned pages were in the block tables
    for r, (g, w) in enumerate(zip(got, want)):
        g = torch.cat(g)
        torch.testing.assert_close(g, w[: len(g)], atol=1e-4, rtol=1e-4, msg=f"request {r}")


def test_outside_a_step_and_bad_layouts_are_refused():
    model = build(llama)
    model.set_attn_implementation(register())
    with pytest.raises(RuntimeError, match="outside"):
        model(input_ids=torch.tensor([[1, 2]]), use_cache=False)
    layers = model_layers(model.config, torch.float32)
    batch = Batch(model, layers)
    ctx = batch.context(np.zeros(0, dtype=np.int64), [0] * len(PROMPTS), "padded")
    with use_step(ctx), pytest.raises(ValueError, match="layout='padded'"):
        model(input_ids=torch.tensor([[1, 2]]), use_cache=False)
    with pytest.raises(ValueError, match="layout='ragged'"):
        StepContext(views=ctx.views, block_tables=ctx.block_tables, cu_q=ctx.cu_q,
                    seq_lens=ctx.seq_lens, write_slots=ctx.write_slots, layout="ragged")
    with pytest.raises(ValueError, match="block_tables\\['full'\\]"):
        StepContext(views=ctx.views, block_tables={}, cu_q=ctx.cu_q, seq_lens=ctx.seq_lens,
                    write_slots=ctx.write_slots)
    with pytest.raises(ValueError, match="cu_q has shape"):
        StepContext(views=ctx.views, block_tables=ctx.block_tables, cu_q=ctx.cu_q[:2],
                    seq_lens=ctx.seq_lens, write_slots=ctx.write_slots)


def test_register_without_a_mask_gives_the_same_logits():
    """mask=False: transformers builds no mask for the custom name (its early exit);
    the kernel masks by position either way."""
    from transformers import AttentionInterface, AttentionMaskInterface

    model = build(gemma3)
    layers = model_layers(model.config, torch.float32)
    tokens = np.random.default_rng(2).integers(0, VOCAB, size=(len(PROMPTS), max(PROMPTS))).tolist()
    outs = []
    for name, mask in (("unikv", True), ("unikv_nomask", False)):
        model.set_attn_implementation(register(name, mask=mask))
        outs.append(torch.cat(Batch(model, layers).step(tokens, list(PROMPTS), "packed")))
    assert "unikv_nomask" in AttentionInterface._global_mapping
    assert "unikv_nomask" not in AttentionMaskInterface._global_mapping
    torch.testing.assert_close(outs[0], outs[1], atol=1e-6, rtol=1e-6)


def test_step_context_refuses_disagreeing_shapes():
    model = build(llama)
    batch = Batch(model, model_layers(model.config, torch.float32))
    ctx = batch.context(np.zeros(0, dtype=np.int64), [0] * len(PROMPTS), "packed")
    with pytest.raises(ValueError, match="must be a StepContext"), use_step("not a context"):
        pass
    with pytest.raises(ValueError, match=r"block_tables\['full'\] has shape \(2, 1\)"):
        StepContext(views=ctx.views, block_tables={"full": ctx.block_tables["full"][:2]}, cu_q=ctx.cu_q,
                    seq_lens=ctx.seq_lens, write_slots=ctx.write_slots)
