"""A Nemotron-H hybrid (Mamba-2 + attention) decoding with its recurrent state in the pool's state slots.

The model is Nemotron-H-56B's config trimmed to 4 layers (mamba, attention,
mamba, MLP), hidden 64, random weights, fp32 on the CPU. Recurrent layers
prefill one request per forward (transformers' torch Mamba-2 path takes no
packed sequences); decode runs the batch together as `[B, 1]`. Until the
attention layers read the pool (kvattn's attention function), the test keeps
each request's K/V itself and hands the model a left-padded batch of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from unikv.sim.models import load_model  # noqa: E402
from unikv.sim.real.state import StateBinder, layer_states, mamba2_layers, state_bytes  # noqa: E402

from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402
from unikv.tensors import LayerState, StateViews  # noqa: E402

SOURCE = Path(__file__).resolve().parents[2] / "data" / "configs" / "nvidia--Nemotron-H-56B-Base-8K_config.json"
TRIM = {"hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
        "conv_kernel": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_head_dim": 16,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "chunk_size": 8,
        "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4, "time_step_rank": 8,
        "initializer_range": 0.1}
ATTN = 1  # the attention layer's index in "M*M-"
PROMPTS = {"a": 3, "b": 9, "c": 17, "d": 26, "e": 12, "f": 5}  # prompt tokens; chunk_size 8, d_conv 4
OUTPUTS = {"a": 3, "b": 8, "c": 6, "d": 8, "e": 5, "f": 4}  # tokens each request generates


def tiny_config() -> dict:
    raw = json.loads(SOURCE.read_text())
    raw.pop("auto_map", None)
    return raw | TRIM


def build(dtype):
    cfg = transformers.NemotronHConfig(**{k: v for k, v in tiny_config().items() if k != "architectures"})
    torch.manual_seed(0)
    return transformers.NemotronHForCausalLM(cfg).to(dtype).eval()


def out_cache(out):
    return getattr(out, "cache", None) or out.past_key_values


@pytest.fixture(scope="module")
def model():
    return build(torch.float32)


@pytest.fixture(scope="module")
def references(model) -> dict:
    return {r: reference(model, r) for r in PROMPTS}


def prompt(rid: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(ord(rid))
    return torch.randint(0, 256, (PROMPTS[rid],), generator=g)


def test_unikv_state_bytes_are_transformers_cache_less_its_redundant_conv_column(tmp_path):
    path = tmp_path / "nemotron_h_tiny.json"
    path.write_text(json.dumps(tiny_config()))
    spec = load_model(path)  # conv in the model dtype (bf16), ssm fp32 (mamba_ssm_cache_dtype)
    model = build(torch.bfloat16)
    with torch.no_grad():
        cache = out_cache(model(input_ids=prompt("c")[None], use_cache=True))
    geoms = mamba2_layers(model)
    hf = sum(cache.get_conv_state(g.layer).nbytes + cache.get_recurrent_state(g.layer).nbytes for g in geoms)
    # transformers keeps d_conv conv columns; vLLM, SGLang and unikv keep d_conv - 1
    redundant = sum(g.conv_dim * cache.get_conv_state(g.layer).element_size() for g in geoms)
    assert spec.state_kinds[0].layers == len(geoms) == 2
    assert spec.state_bytes == hf - redundant == state_bytes(layer_states(model))


def reference(model, rid: str) -> tuple[list[int], torch.Tensor]:
    """transformers' own greedy generation of one request alone: tokens, logits per token."""
    with torch.no_grad():
        ids = prompt(rid)[None]  # an explicit mask: generate would take token 0 (pad) for padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUTS[rid], do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, PROMPTS[rid]:].tolist(), torch.stack(out.logits)[:, 0]


class PoolRun:
    """Requests whose recurrent state lives in the pool; attention K/V kept per request."""

    def __init__(self, model, compaction: str = "eager") -> None:
        states = layer_states(model)
        kv_bytes = 2 * 2 * 16 * 4  # K and V, 2 heads x 16, fp32: one attention layer
        layout = Layout(total_bytes=1 << 20, bands=[
            Band("mamba", entry_bytes=state_bytes(states), grow="up", unit="request"),
            Band("full", entry_bytes=kv_bytes, grow="down", page_size=4, blocks_per_page=2)])
        self.pool = UnifiedPool(layout, SimBackend(materialize=True), compaction=compaction)
        self.model = model
        self.binder = StateBinder(model, StateViews(self.pool, states))
        self.sid: dict[str, int] = {}
        self.kv: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # [Hkv, L, D] each
        self.tokens: dict[str, list[int]] = {}
        self.logits: dict[str, list[torch.Tensor]] = {}

    def slots(self, rids) -> torch.Tensor:
        return torch.as_tensor(self.pool.translate([self.sid[r] for r in rids], "mamba"))

    def admit(self, rid: str) -> None:
        self.sid[rid] = int(self.pool.alloc_state("mamba", 1)[0])
        slots = self.slots([rid])
        cache = self.binder.before(slots, fresh=True)
        with torch.no_grad():
            out = self.model(input_ids=prompt(rid)[None], cache=cache, use_cache=True)
        self.binder.after(cache, slots)
        layer = cache.layers[ATTN]
        self.kv[rid] = (layer.keys[0], layer.values[0])
        self.record(rid, out.logits[0, -1])

    def record(self, rid: str, logits: torch.Tensor) -> None:
        self.tokens.setdefault(rid, []).append(int(logits.argmax()))
        self.logits.setdefault(rid, []).append(logits)

    def decode(self, rids: list[str]) -> None:
        slots = self.slots(rids)
        cache = self.binder.before(slots)
        lens = [self.kv[r][0].shape[1] for r in rids]
        longest = max(lens)
        keys = torch.zeros((len(rids), 2, longest, 16))
        values = torch.zeros_like(keys)
        mask = torch.zeros((len(rids), longest + 1), dtype=torch.long)
        for b, r in enumerate(rids):
            keys[b, :, longest - lens[b]:], values[b, :, longest - lens[b]:] = self.kv[r]
            mask[b, longest - lens[b]:] = 1
        cache.update(keys, values, ATTN)
        ids = torch.tensor([[self.tokens[r][-1]] for r in rids])
        pos = torch.tensor([[n] for n in lens])
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        self.binder.after(cache, slots)
        layer = cache.layers[ATTN]
        for b, r in enumerate(rids):
            k, v = self.kv[r]
            self.kv[r] = (torch.cat([k, layer.keys[b, :, -1:]], 1), torch.cat([v, layer.values[b, :, -1:]], 1))
            self.record(r, out.logits[b, -1])

    def finish(self, rid: str) -> None:
        self.pool.free_state("mamba", [self.sid.pop(rid)])


@pytest.mark.parametrize("compaction", ["eager", "lazy"])
def test_decode_through_pool_state_equals_transformers_generation(model, references, compaction):
    run = PoolRun(model, compaction)
    running = ["a", "b", "c", "d"]
    for r in running:
        run.admit(r)
    moved = 0
    for _step in range(8):
        done = [r for r in running if len(run.tokens[r]) == OUTPUTS[r]]
        for r in done:
            running.remove(r)
            before = run.slots(running).tolist() if running else []
            run.finish(r)
            run.pool.flush(urgent=True)  # lazy: pack the band now, so slots move under the state
            moved += sum(x != y for x, y in zip(before, run.slots(running).tolist()))
        for r in [r for r in ("e", "f") if r not in run.tokens][:len(done)]:
            run.admit(r)  # a new request takes a freed slot between decode steps
            running.append(r)
        if running:
            run.decode(running)
    assert moved > 0, "no live state slot moved: the test did not exercise compaction"
    assert set(run.tokens) == set(PROMPTS)
    for r in PROMPTS:
        tokens, logits = references[r]
        assert run.tokens[r] == tokens, r
        torch.testing.assert_close(torch.stack(run.logits[r]), logits, rtol=1e-4, atol=1e-4)
    assert run.pool.verify() == []


def test_decode_reads_the_state_from_the_slot(model, references):
    """Control: zeroing a request's slot changes its next logits, so the
    equality above comes from the pool's bytes."""
    run = PoolRun(model)
    for r in ("b", "c"):
        run.admit(r)
    run.decode(["b", "c"])
    views = run.binder.views
    slot = int(run.slots(["c"])[0])
    for g in run.binder.layers:
        views.get(g.layer, "ssm")[slot] = 0
    run.decode(["b", "c"])
    assert not torch.allclose(run.logits["c"][2], references["c"][1][2], atol=1e-3)
    torch.testing.assert_close(run.logits["b"][2], references["b"][1][2], rtol=1e-4, atol=1e-4)


def test_binder_refusals(model):
    run = PoolRun(model)
    states = layer_states(model)
    wrong = tuple(LayerState(s.layer, s.band, (("conv", (3, 3), torch.float32), s.tensors[1])) for s in states)
    layout = Layout(total_bytes=1 << 20, bands=[
        Band("mamba", entry_bytes=state_bytes(wrong), grow="up", unit="request")])
    pool = UnifiedPool(layout, SimBackend(materialize=True))
    with pytest.raises(ValueError, match=r"^StateBinder: layer 0: views hold conv \(3, 3\)"):
        StateBinder(model, StateViews(pool, wrong))
    run.admit("a")
    slots = run.slots(["a"])
    with pytest.raises(ValueError, match="^StateBinder.after: layer 0: the cache holds no state"):
        run.binder.after(run.binder.before(slots, fresh=True), slots)
    with pytest.raises(ValueError, match=r"^StateBinder: slots=\[.*\] repeat a slot"):
        run.binder.before(torch.cat([slots, slots]))


def test_steady_decode_reuses_one_cache_and_empties_its_attention(model):
    run = PoolRun(model)
    for r in ("b", "c"):
        run.admit(r)
    run.decode(["b", "c"])
    slots = run.slots(["b", "c"])
    first = run.binder.before(slots)
    ssm_ptr = first.get_recurrent_state(0).data_ptr()
    assert first.layers[ATTN].keys is None  # the last forward's K/V were dropped
    run.binder.after(first, slots)
    again = run.binder.before(slots)
    assert again is first and again.get_recurrent_state(0).data_ptr() == ssm_ptr
    run.binder.after(again, slots)
    assert run.binder.before(slots[:1]) is not first  # another batch size: a new cache
