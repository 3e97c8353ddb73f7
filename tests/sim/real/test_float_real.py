"""FLOAT-band relocations under a real model: LFM3 (short conv + sliding + full) on `end_float_end`.

LFM3 (transformers 5.24, `models/lfm3`) keeps three kinds of cache: a
short-conv state per request (conv layers), a window of K/V (sliding
layers) and every token's K/V (full layers). Its unified layout is the
simulator's `end_float_end`, `mamba(up) | swa(float) | full(down)`, built
here by `sim.layouts.build_layout` from the model's kinds: the chain the
reference allocator gives a model with state + window + full (its
`UnifiedMambaSWATokenToKVPoolAllocator`): the state band and the unbounded
full band take the ends, the window band, capped per request and cheapest
to move, floats.

Sixteen requests of varied prompt (5-35) and output (3-12) lengths arrive
two per step and run through this file's small engine loop: each admission
prefills alone (transformers' conv path takes no packed batch), 12 tokens
per forward (a later chunk gathers the state the earlier one left), running
requests decode together `[B, 1]`, the window ratchet releases the sliding
band's pages that left the window (the float's holes), finished requests
free everything, and an alloc the pool cannot serve after its shortfall
ladder (which relocates the float) retracts the newest request, whose
readmission recomputes its prompt and all but its newest token. The budget
is tight, so the float relocates mid-generation; the test counts
relocations, page moves and retractions and fails without them, then
compares every generated token with transformers' greedy `generate` of the
request alone (its own cache, the same weights).

Not the real scheduler (`sim.run`): unikv's config reader has no LFM3
defaults (LFM2 and Nemotron-H replay through `sim.run` with their state
bound: `test_hybrid_replay.py`).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Lfm3ForCausalLM"):
    pytest.skip("this transformers has no LFM3 (transformers >= 5.24)", allow_module_level=True)

import numpy as np  # noqa: E402
from unikv.sim.layouts import build_layout  # noqa: E402
from unikv.sim.model_spec import ModelSpec  # noqa: E402
from unikv.sim.real.attention import StepContext, register, use_step  # noqa: E402
from unikv.sim.real.layers import check_layout, model_layers  # noqa: E402
from unikv.sim.real.state import (  # noqa: E402
    ShortConvGeometry,
    StateBinder,
    cache_kwarg,
    layer_states,
    recurrent_layers,
    state_bytes,
)

from unikv.backends import SimBackend  # noqa: E402
from unikv.tensors import KVViews, StateViews  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WINDOW, L_CACHE = 64, 4, 2, 16, 8, 4
LAYER_TYPES = ["conv", "sliding_attention", "conv", "full_attention", "sliding_attention", "conv"]
PS = 4  # tokens per page
CHUNK = 12  # prefill tokens per forward
N = 16
ARRIVALS_PER_STEP = 2


def config():
    return transformers.Lfm3Config(
        vocab_size=256, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, sliding_window=WINDOW,
        conv_L_cache=L_CACHE, layer_types=LAYER_TYPES, max_position_embeddings=4096, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, initializer_range=0.1)


def build():
    torch.manual_seed(0)
    return transformers.Lfm3ForCausalLM(config()).eval()


def spec() -> ModelSpec:
    """LFM3-tiny as the simulator's layouts read a model: bytes per token of
    each band and per request of the state, fp32 (the simulator's kinds keep
    conv state in 2 bytes, so the spec is given by its band fields)."""
    kv = KV_HEADS * 2 * HEAD_DIM * 4
    return ModelSpec(name="lfm3-tiny", kv_cache_dtype="fp32", model_type="lfm3",
                     full_layers=LAYER_TYPES.count("full_attention"),
                     full_token_bytes=kv * LAYER_TYPES.count("full_attention"),
                     swa_layers=LAYER_TYPES.count("sliding_attention"), window_tokens=WINDOW,
                     swa_token_bytes=kv * LAYER_TYPES.count("sliding_attention"),
                     state_layers=LAYER_TYPES.count("conv"),
                     state_bytes=LAYER_TYPES.count("conv") * HIDDEN * (L_CACHE - 1) * 4)


def workload() -> list[tuple[np.ndarray, int]]:
    """(prompt ids, output tokens) of the 16 requests."""
    rng = np.random.default_rng(3)
    return [(rng.integers(3, 256, int(rng.integers(5, 36))), int(rng.integers(3, 13))) for _ in range(N)]


@pytest.fixture(scope="module")
def references() -> list[list[int]]:
    """transformers' own greedy generation of each request alone (its own cache)."""
    model = build()
    out = []
    with torch.inference_mode():
        for prompt, n in workload():
            ids = torch.as_tensor(prompt)[None]
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 pad_token_id=0)
            out.append(gen[0, len(prompt):].tolist())
    return out


class Engine:
    """A small engine over an `end_float_end` pool: admit, prefill alone,
    decode together, ratchet the window, finish, retract the newest on a
    shortfall (the pool never evicts; the caller decides)."""

    def __init__(self, model, budget_bytes: int, compaction: str) -> None:
        self.plan = build_layout(spec(), kv_budget_gib=budget_bytes / 2**30, page_size=PS, kind="end_float_end")
        layout = self.plan.layout
        placed = model_layers(model.config, torch.float32)
        check_layout(placed, layout)
        states = layer_states(model, "mamba")
        assert layout.geometry("mamba").band.entry_bytes == state_bytes(states)
        self.pool = self.plan.make_pool(SimBackend(materialize=True), compaction=compaction)
        self.model = model
        self.kv = KVViews(self.pool, placed.kv)
        self.binder = StateBinder(model, StateViews(self.pool, states))
        self.work = workload()
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.sid: dict[int, int] = {}
        self.vids: dict[int, np.ndarray] = {}
        self.released: dict[int, int] = {}  # rid -> pages released on the window band
        self.generated: dict[int, list[int]] = {r: [] for r in range(N)}
        self.retracted_after: list[int] = []  # tokens generated when each retraction hit

    def context(self, rid: int) -> np.ndarray:
        """What an admission prefills: the prompt and all but the newest generated token."""
        prompt, _ = self.work[rid]
        return np.concatenate([prompt, self.generated[rid][:-1]]).astype(np.int64)

    def forward(self, rids: list[int], new: np.ndarray, ids, layout: str, cache):
        lens = [len(self.vids[r]) for r in rids]
        news = [ids.shape[1]] if layout == "packed" else [1] * len(rids)
        pos = torch.cat([torch.arange(n - q, n) for n, q in zip(lens, news)]).reshape(ids.shape)
        pages = [self.vids[r][::PS] // PS for r in rids]
        ctx = StepContext(
            views=self.kv, layout=layout, block_tables={b: self.kv.block_table(pages, b) for b in ("full", "swa")},
            cu_q=torch.tensor(np.concatenate([[0], np.cumsum(news)]), dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            write_slots={b: torch.as_tensor(self.pool.translate(new, b)) for b in ("full", "swa")})
        with use_step(ctx), torch.inference_mode():
            return self.model(input_ids=ids, position_ids=pos, use_cache=True,
                              **{cache_kwarg(self.model): cache}).logits

    def admit(self, rid: int) -> bool:
        """Allocate and prefill one waiting request, `CHUNK` tokens per forward
        (a later chunk gathers the state the earlier one left in the slot,
        whose bytes and window pages may have moved between the two); False,
        nothing held, when a chunk does not fit."""
        ctx = self.context(rid)
        state = self.pool.alloc_state("mamba", 1)
        if state is None:
            return False
        self.sid[rid], self.vids[rid], self.released[rid] = int(state[0]), np.zeros(0, dtype=np.int64), 0
        for start in range(0, len(ctx), CHUNK):
            stop = min(start + CHUNK, len(ctx))
            new = self.pool.alloc_extend([start], [stop], [self.vids[rid][-1] if start else 0])
            if new is None:
                self.release_all(rid)
                return False
            self.vids[rid] = np.concatenate([self.vids[rid], new])
            slots = self.slots([rid])
            cache = self.binder.before(slots, fresh=start == 0)
            logits = self.forward([rid], np.asarray(new), torch.as_tensor(ctx[start:stop])[None], "packed", cache)
            self.binder.after(cache, slots)
            self.ratchet(rid)
        if not self.generated[rid]:  # a readmission samples nothing: its next input is known
            self.generated[rid].append(int(logits[0, -1].argmax()))
        self.running.append(rid)
        return True

    def slots(self, rids: list[int]):
        return torch.as_tensor(self.pool.translate([self.sid[r] for r in rids], "mamba"))

    def decode(self) -> None:
        """One `[B, 1]` step of every running request; retract the newest while the pool falls short."""
        while self.running:
            rids = list(self.running)
            new = self.pool.alloc_decode([len(self.vids[r]) + 1 for r in rids], [self.vids[r][-1] for r in rids])
            if new is not None:
                break
            self.retract(self.running[-1])
        else:
            return
        new = np.asarray(new)
        for r, v in zip(rids, new):
            self.vids[r] = np.append(self.vids[r], v)
        slots = self.slots(rids)
        cache = self.binder.before(slots)
        ids = torch.tensor([[self.generated[r][-1]] for r in rids])
        logits = self.forward(rids, new, ids, "padded", cache)
        self.binder.after(cache, slots)
        for b, r in enumerate(rids):
            self.generated[r].append(int(logits[b, -1].argmax()))

    def ratchet(self, rid: int) -> None:
        """Release the window band's pages no later query of `rid` can see
        (positions below seq - window + 1)."""
        dead = (len(self.vids[rid]) - WINDOW + 1) // PS  # whole pages before the window
        if dead > self.released[rid]:
            self.pool.release(self.vids[rid][self.released[rid] * PS:dead * PS], band="swa",
                              start_pos=self.released[rid] * PS)
            self.released[rid] = dead

    def release_all(self, rid: int) -> None:
        """Free everything `rid` holds (the pool releases each band still bound)."""
        vids = self.vids.pop(rid)
        if len(vids):
            self.pool.free(vids)
        self.pool.free_state("mamba", [self.sid.pop(rid)])

    def drop(self, rid: int) -> None:
        self.running.remove(rid)
        self.release_all(rid)

    def retract(self, rid: int) -> None:
        self.retracted_after.append(len(self.generated[rid]))
        self.drop(rid)
        self.waiting.insert(0, rid)

    def run(self) -> None:
        arrived = 0
        for _step in range(400):
            self.waiting += range(arrived, min(N, arrived + ARRIVALS_PER_STEP))
            arrived = min(N, arrived + ARRIVALS_PER_STEP)
            while self.waiting and self.admit(self.waiting[0]):
                self.waiting.pop(0)
            for r in [r for r in self.running if len(self.generated[r]) == self.work[r][1]]:
                self.drop(r)
            self.decode()
            for r in [r for r in self.running if len(self.generated[r]) == self.work[r][1]]:
                self.drop(r)
            for r in self.running:
                self.ratchet(r)
            self.pool.flush(urgent=False)
            assert self.pool.verify() == []
            if arrived == N and not self.running and not self.waiting:
                return
        raise AssertionError("the requests did not finish in 400 steps")


def test_lfm3_layers_are_the_simulators_end_float_end_bands():
    model = build()
    plan = build_layout(spec(), kv_budget_gib=1e-3, page_size=PS, kind="end_float_end")
    assert plan.chain == "mamba(up) | swa(float) | full(down)"
    assert all(isinstance(g, ShortConvGeometry) for g in recurrent_layers(model))
    assert [g.layer for g in recurrent_layers(model)] == [i for i, t in enumerate(LAYER_TYPES) if t == "conv"]
    check_layout(model_layers(model.config, torch.float32), plan.layout)  # raises on a mismatch
    assert plan.layout.geometry("mamba").band.entry_bytes == state_bytes(layer_states(model)) == 3 * HIDDEN * 3 * 4


BUDGET = 50_000  # bytes: tight enough that the float relocates and requests are retracted (200 KB: neither)


@pytest.mark.parametrize("compaction", ["lazy", "eager"])
def test_greedy_tokens_through_a_relocating_float_equal_transformers(references, compaction):
    model = build()
    model.set_attn_implementation(register())
    torch.set_num_threads(1)
    engine = Engine(model, BUDGET, compaction)
    engine.run()
    stats = engine.pool.stats()
    assert stats["relocations"] > 0, f"the float never relocated: {stats}"
    moved = {band: stats["bands"][band]["moves"] for band in ("mamba", "swa", "full")}
    assert all(moved.values()), f"a band moved no live page or slot: {moved}"
    assert any(g > 0 for g in engine.retracted_after), "no request was retracted mid-generation"
    for rid in range(N):
        assert engine.generated[rid] == references[rid], f"request {rid}"


def test_control_without_the_state_from_the_slot_the_tokens_differ(references):
    """The comparison above depends on the slots' bytes: a binder that starts
    every forward from zero state (as a forward without state binding would)
    changes some request's tokens."""
    model = build()
    model.set_attn_implementation(register())
    torch.set_num_threads(1)
    engine = Engine(model, BUDGET, "lazy")
    before = engine.binder.before
    engine.binder.before = lambda slots, fresh=False: before(slots, fresh=True)
    engine.run()
    assert any(engine.generated[rid] != references[rid] for rid in range(N))
