"""A Nemotron-H hybrid (Mamba-2 + attention) decoding with its recurrent state in the pool's state slots.

The model is Nemotron-H-56B's config trimmed to 4 layers (mamba, attention,
mamba, MLP), hidden 64, random weights, fp32 on the CPU. Recurrent layers
prefill one request per forward (transformers' torch Mamba-2 path takes no
packed sequences); decode runs the batch together as `[B, 1]`. The attention
layer reads and writes its K/V in the pool's token band through the "unikv"
attention function (`unikv.sim.real.attention`); the Mamba-2 layers' state
lives in the pool's state band (`StateBinder`). Between decode steps requests
finish and others take their slots, and a flush moves live pages and slots of
both bands under the views.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

import numpy as np  # noqa: E402
from unikv.sim.models import load_model  # noqa: E402
from unikv.sim.real.attention import StepContext, register, use_step  # noqa: E402
from unikv.sim.real.state import (  # noqa: E402
    StateBinder,
    cache_kwarg,
    conv_state,
    layer_states,
    mamba2_layers,
    recurrent_state,
    state_bytes,
)

from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402
from unikv.tensors import KVViews, LayerKV, LayerState, StateViews  # noqa: E402

SOURCE = Path(__file__).resolve().parents[2] / "data" / "configs" / "nvidia--Nemotron-H-56B-Base-8K_config.json"
TRIM = {"hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
        "conv_kernel": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_head_dim": 16,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "chunk_size": 8,
        "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4, "time_step_rank": 8,
        "initializer_range": 0.1}
ATTN = 1  # the attention layer's index in "M*M-"
PS = 4  # tokens per page
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
def pool_model():
    """The same weights, its attention reading the pool."""
    model = build(torch.float32)
    model.set_attn_implementation(register())
    return model


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
    hf = sum(conv_state(cache, g.layer).nbytes + recurrent_state(cache, g.layer).nbytes for g in geoms)
    # transformers keeps d_conv conv columns; vLLM, SGLang and unikv keep d_conv - 1
    redundant = sum(g.conv_dim * conv_state(cache, g.layer).element_size() for g in geoms)
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
    """Requests whose attention K/V live in the pool's token band and whose
    recurrent state lives in its state band."""

    def __init__(self, model, compaction: str = "eager") -> None:
        states = layer_states(model)
        kv = [LayerKV(ATTN, "full", 2, 16, 16, model.dtype)]
        layout = Layout(total_bytes=1 << 20, bands=[
            Band("mamba", entry_bytes=state_bytes(states), grow="up", unit="request"),
            Band("full", entry_bytes=kv[0].token_bytes, grow="down", page_size=PS, blocks_per_page=2)])
        self.pool = UnifiedPool(layout, SimBackend(materialize=True), compaction=compaction)
        self.model = model
        self.kv = KVViews(self.pool, kv)
        self.binder = StateBinder(model, StateViews(self.pool, states))
        self.sid: dict[str, int] = {}
        self.vids: dict[str, np.ndarray] = {}
        self.tokens: dict[str, list[int]] = {}
        self.logits: dict[str, list[torch.Tensor]] = {}

    def slots(self, rids) -> torch.Tensor:
        return torch.as_tensor(self.pool.translate([self.sid[r] for r in rids], "mamba"))

    def kv_slots(self, rids) -> list[int]:
        return np.concatenate([self.pool.translate(self.vids[r], "full") for r in rids]).tolist()

    def forward(self, rids: list[str], new: np.ndarray, ids: torch.Tensor, layout: str, cache):
        """One forward of `ids` (new tokens at vids `new`) with attention over the pool."""
        lens = [len(self.vids[r]) for r in rids]
        news = [ids.shape[1]] if layout == "packed" else [1] * len(rids)
        pos = torch.cat([torch.arange(n - q, n) for n, q in zip(lens, news)]).reshape(ids.shape)
        ctx = StepContext(
            views=self.kv, layout=layout,
            block_tables={"full": self.kv.block_table([self.vids[r][::PS] // PS for r in rids], "full")},
            cu_q=torch.tensor(np.concatenate([[0], np.cumsum(news)]), dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            write_slots={"full": torch.as_tensor(self.pool.translate(new, "full"))})
        with use_step(ctx), torch.no_grad():
            return self.model(input_ids=ids, position_ids=pos, use_cache=True,
                              **{cache_kwarg(self.model): cache}).logits

    def admit(self, rid: str, chunks: tuple[int, ...] | None = None) -> None:
        """Prefill one request alone (the torch Mamba-2 path takes no packed
        batch), in `chunks` (default: the whole prompt in one): a later
        chunk gathers the state the earlier one left in the slot."""
        self.sid[rid] = int(self.pool.alloc_state("mamba", 1)[0])
        self.vids[rid] = np.zeros(0, dtype=np.int64)
        slots = self.slots([rid])
        done = 0
        for n in chunks or (PROMPTS[rid],):
            last = self.vids[rid][-1] if done else 0
            new = np.asarray(self.pool.alloc_extend([done], [done + n], [last]))
            self.vids[rid] = np.concatenate([self.vids[rid], new])
            cache = self.binder.before(slots, fresh=done == 0)
            logits = self.forward([rid], new, prompt(rid)[None, done:done + n], "packed", cache)
            self.binder.after(cache, slots)
            done += n
        self.record(rid, logits[0, -1])

    def record(self, rid: str, logits: torch.Tensor) -> None:
        self.tokens.setdefault(rid, []).append(int(logits.argmax()))
        self.logits.setdefault(rid, []).append(logits)

    def decode(self, rids: list[str]) -> None:
        """One `[B, 1]` decode step of `rids`, state gathered from and scattered to their slots."""
        seq = [len(self.vids[r]) + 1 for r in rids]
        new = np.asarray(self.pool.alloc_decode(seq, [self.vids[r][-1] for r in rids]))
        for r, v in zip(rids, new):
            self.vids[r] = np.append(self.vids[r], v)
        slots = self.slots(rids)
        cache = self.binder.before(slots)
        ids = torch.tensor([[self.tokens[r][-1]] for r in rids])
        logits = self.forward(rids, new, ids, "padded", cache)
        self.binder.after(cache, slots)
        for b, r in enumerate(rids):
            self.record(r, logits[b, -1])

    def finish(self, rid: str) -> None:
        self.pool.free(self.vids.pop(rid))
        self.pool.free_state("mamba", [self.sid.pop(rid)])


@pytest.mark.parametrize("compaction", ["eager", "lazy"])
def test_decode_through_pool_equals_transformers_generation(pool_model, references, compaction):
    run = PoolRun(pool_model, compaction)
    running = ["a", "b", "c", "d"]
    for r in running:
        run.admit(r, chunks=(11, 15) if r == "d" else None)  # d: a chunked prefill
    state_moved = kv_moved = 0
    for _step in range(8):
        done = [r for r in running if len(run.tokens[r]) == OUTPUTS[r]]
        for r in done:
            running.remove(r)
            before = (run.slots(running).tolist(), run.kv_slots(running)) if running else ([], [])
            run.finish(r)
            run.pool.flush(urgent=True)  # lazy: pack the bands now, so slots move under the data
            if running:
                state_moved += sum(x != y for x, y in zip(before[0], run.slots(running).tolist()))
                kv_moved += sum(x != y for x, y in zip(before[1], run.kv_slots(running)))
        for r in [r for r in ("e", "f") if r not in run.tokens][:len(done)]:
            run.admit(r)  # a new request takes a freed slot between decode steps
            running.append(r)
        if running:
            run.decode(running)
    assert state_moved > 0 and kv_moved > 0, "no live slot moved: the test did not exercise compaction"
    assert set(run.tokens) == set(PROMPTS)
    for r in PROMPTS:
        tokens, logits = references[r]
        assert run.tokens[r] == tokens, r
        torch.testing.assert_close(torch.stack(run.logits[r]), logits, rtol=1e-4, atol=1e-4)
    assert run.pool.verify() == []


def test_decode_reads_the_state_from_the_slot(pool_model, references):
    """Control: zeroing a request's slot changes its next logits, so the
    equality above comes from the pool's bytes."""
    run = PoolRun(pool_model)
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


def test_binder_refusals(model, pool_model):
    run = PoolRun(pool_model)
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


def test_steady_decode_reuses_one_cache_and_empties_its_attention(pool_model):
    run = PoolRun(pool_model)
    for r in ("b", "c"):
        run.admit(r)
    run.decode(["b", "c"])
    slots = run.slots(["b", "c"])
    first = run.binder.before(slots)
    ssm_ptr = recurrent_state(first, 0).data_ptr()
    assert first.layers[ATTN].keys is None  # the last forward's K/V were dropped
    run.binder.after(first, slots)
    again = run.binder.before(slots)
    assert again is first and recurrent_state(again, 0).data_ptr() == ssm_ptr
    run.binder.after(again, slots)
    assert run.binder.before(slots[:1]) is not first  # another batch size: a new cache


def test_bf16_state_round_trips_through_the_pool_bit_exactly():
    """At the engine's dtypes (conv bf16, SSM fp32) the pool loses nothing:
    decoding with the state gathered from and scattered to a slot that moves
    gives bit-identical logits to keeping it in transformers' own cache."""
    model = build(torch.bfloat16)
    model.set_attn_implementation(register())
    assert {t[2] for s in layer_states(model) for t in s.tensors} == {torch.bfloat16, torch.float32}
    pooled, own = PoolRun(model), PoolRun(model)
    filler = pooled.pool.alloc_state("mamba", 2)  # freed below: the request's slot then moves
    pooled.admit("c")
    own.sid["c"] = 0
    own.vids["c"] = np.asarray(own.pool.alloc_extend([0], [PROMPTS["c"]], [0]))
    cache = transformers.DynamicCache(config=model.config)
    own.record("c", own.forward(["c"], own.vids["c"], prompt("c")[None], "packed", cache)[0, -1])
    slot = int(pooled.slots(["c"])[0])
    pooled.pool.free_state("mamba", filler)
    assert int(pooled.slots(["c"])[0]) != slot
    for _ in range(4):
        pooled.decode(["c"])
        seq = len(own.vids["c"]) + 1
        new = np.asarray(own.pool.alloc_decode([seq], [own.vids["c"][-1]]))
        own.vids["c"] = np.append(own.vids["c"], new)
        for layer in cache.layers:
            if not hasattr(layer, "conv_states"):
                layer.reset()  # the attention K/V live in the pool
        ids = torch.tensor([[own.tokens["c"][-1]]])
        own.record("c", own.forward(["c"], new, ids, "padded", cache)[0, -1])
    assert pooled.tokens["c"] == own.tokens["c"]
    for a, b in zip(pooled.logits["c"], own.logits["c"]):
        assert torch.equal(a, b)


def test_state_accessors_read_a_cache_without_the_getters_as_transformers_5_17_keeps_it():
    """transformers 5.17 (the H200 image) has no Cache.get_conv_state /
    get_recurrent_state: the accessors read the layer's lists instead."""
    from types import SimpleNamespace

    conv, ssm = torch.zeros(2, 3, 4), torch.ones(2, 5)
    held = SimpleNamespace(conv_states=[conv], recurrent_states=[ssm], has_previous_state=[True])
    empty = SimpleNamespace(conv_states=[conv], recurrent_states=[ssm], has_previous_state=[False])
    cache = SimpleNamespace(layers=[held, empty])
    assert conv_state(cache, 0) is conv and recurrent_state(cache, 0) is ssm
    assert conv_state(cache, 1) is None and recurrent_state(cache, 1) is None


def test_gathering_decode_buckets_share_one_static_state_store(pool_model, monkeypatch):
    """Decode buckets that gather the batch's state (`DecodeGraphs` with the
    binder, for a model whose recurrent layers cannot update in slot: LFM2's
    short conv; forced here) keep their static caches as views of one store
    of the largest bucket's rows (sized by `capture_buckets`): one step runs
    at a time, and a store per bucket would double the state memory (47 MiB
    a row for Nemotron-3-Nano). Each view has its bucket's rows; the
    attention layers stay empty."""
    from unikv.sim.real import slot_decode
    from unikv.sim.real.graphs import DecodeGraphs

    monkeypatch.setattr(slot_decode, "slot_ready", lambda model: "forced: the gathering path")
    run = PoolRun(pool_model)
    graphs = DecodeGraphs(pool_model, run.kv, ["full"], device="cpu", max_pages=8, binder=run.binder)
    graphs.capture_buckets(5)
    assert graphs.stats()["buckets"] == [1, 2, 4, 8]
    assert graphs.stats()["state"] == "gathered and scattered: forced: the gathering path"
    for g in run.binder.layers:
        convs = [conv_state(graphs._buckets[n].cache, g.layer) for n in (1, 2, 4, 8)]
        ssms = [recurrent_state(graphs._buckets[n].cache, g.layer) for n in (1, 2, 4, 8)]
        assert [t.shape[0] for t in convs] == [t.shape[0] for t in ssms] == [1, 2, 4, 8]
        assert len({t.data_ptr() for t in convs}) == len({t.data_ptr() for t in ssms}) == 1
    assert graphs._buckets[8].cache.layers[ATTN].keys is None


def test_in_slot_decode_buckets_keep_one_row_of_state_and_carry_their_slot_index(pool_model):
    """A Mamba-2 model's decode buckets update the state in the pool's slots
    (`sim.real.slot_decode`): every bucket's cache keeps one row of
    recurrent state (one store for all of them, not the largest bucket's
    rows) and carries its own slot index, the buffer a step fills."""
    from unikv.sim.real.graphs import DecodeGraphs
    from unikv.sim.real.slot_decode import SLOTS_ATTR

    run = PoolRun(pool_model)
    graphs = DecodeGraphs(pool_model, run.kv, ["full"], device="cpu", max_pages=8, binder=run.binder)
    graphs.capture_buckets(5)
    assert graphs.in_slot and graphs.stats()["state"] == "in slot"
    for g in run.binder.layers:
        ssms = [recurrent_state(graphs._buckets[n].cache, g.layer) for n in (1, 2, 4, 8)]
        assert [t.shape[0] for t in ssms] == [1, 1, 1, 1] and len({t.data_ptr() for t in ssms}) == 1
    for n, st in graphs._buckets.items():
        carried = getattr(st.cache, SLOTS_ATTR)
        assert carried.slots is st.slots and carried.views is run.binder.views and st.slots.shape == (n,)
