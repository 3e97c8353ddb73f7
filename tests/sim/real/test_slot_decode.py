"""A Mamba-2 decode token updating its state in the pool's slots (`sim.real.slot_decode`).

One Nemotron-H Mamba-2 mixer (Nemotron-H-56B's config trimmed as in
`test_hybrid_replay.py`, fp32 on the CPU) prefills three sequences with
transformers' own forward and cache; their conv and SSM state is copied
into three scattered slots of a pool's state band, whose other slots hold
sentinel bytes. Then each decode token runs twice: through transformers'
one-token path with its cache, and through `slot_forward` (inside
`served_mixers`) with the slots: outputs and states must agree to fp32
rounding, and no other slot may change. The replays that run the whole
model this way are `test_hybrid_replay.py`'s decode-graph tests.
"""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim.real.mixers import served_mixers  # noqa: E402
from unikv.sim.real.slot_decode import DecodeSlots, carry, slot_forward, slot_ready  # noqa: E402
from unikv.sim.real.ssd import kernel_chunk_scan  # noqa: E402
from unikv.sim.real.state import conv_state, layer_states, recurrent_state, state_bytes  # noqa: E402

from tests.sim.real.test_hybrid_replay import LFM2, SOURCE, TRIM  # noqa: E402
from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402
from unikv.tensors import StateViews  # noqa: E402

SLOTS = [6, 2, 4]  # the three rows' slots: out of order, with free slots between them
SENTINEL = 7.25


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


def pooled(model):
    """StateViews over a pool's state band of 8 slots, every byte `SENTINEL`."""
    states = layer_states(model)
    layout = Layout(total_bytes=1 << 22, bands=[Band("mamba", entry_bytes=state_bytes(states), grow="up",
                                                     unit="request")])
    pool = UnifiedPool(layout, SimBackend(materialize=True))
    views = StateViews(pool, states)
    for s in states:
        for name, *_ in s.tensors:
            views.get(s.layer, name).fill_(SENTINEL)
    return pool, views


def prefilled(model, m, kwarg, seed: int = 3):
    """transformers' cache after a 6-token chunk of 3 rows, and the decode tokens to run."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode(), kernel_chunk_scan():
        m(torch.randn(3, 6, hidden, generator=g), **{kwarg: cache})
    return cache, [torch.randn(3, 1, hidden, generator=g) for _ in range(4)]


def into_slots(views, m, cache, slots) -> None:
    idx = torch.tensor(slots)
    views.get(m.layer_idx, "conv")[idx] = conv_state(cache, m.layer_idx)[..., 1:]
    views.get(m.layer_idx, "ssm")[idx] = recurrent_state(cache, m.layer_idx)


def test_in_slot_decode_gives_transformers_outputs_and_state_and_touches_no_other_slot(mixer):
    model, m, kwarg = mixer
    cache, tokens = prefilled(model, m, kwarg)
    pool, views = pooled(model)
    into_slots(views, m, cache, SLOTS)
    before = {name: views.get(m.layer_idx, name).clone() for name in ("conv", "ssm")}
    decode = carry(SimpleNamespace(), DecodeSlots(torch.tensor(SLOTS), views))
    with torch.inference_mode():
        for tok in tokens:
            with kernel_chunk_scan():
                want = m(tok, **{kwarg: cache})
            with served_mixers(model):
                got = m(tok, **{kwarg: decode})
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    idx = torch.tensor(SLOTS)
    torch.testing.assert_close(views.get(m.layer_idx, "conv")[idx], conv_state(cache, m.layer_idx)[..., 1:],
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(views.get(m.layer_idx, "ssm")[idx], recurrent_state(cache, m.layer_idx),
                               rtol=1e-5, atol=1e-6)
    others = [s for s in range(before["ssm"].shape[0]) if s not in SLOTS]
    for name in ("conv", "ssm"):
        assert torch.equal(views.get(m.layer_idx, name)[others], before[name][others]), name
        assert not torch.equal(views.get(m.layer_idx, name)[idx], before[name][idx]), name
    for layer in {s.layer for s in layer_states(model)} - {m.layer_idx}:  # the other mixer: not run here
        assert bool((views.get(layer, "ssm") == SENTINEL).all())


def test_control_rows_that_read_each_others_slots_give_other_outputs(mixer):
    """Control: the same state behind the slots, the index rotated (row 0
    reads row 1's slot...): the outputs change, so the equality above comes
    from the slots the index names."""
    model, m, kwarg = mixer
    cache, tokens = prefilled(model, m, kwarg)
    _, views = pooled(model)
    into_slots(views, m, cache, SLOTS)
    with torch.inference_mode():
        with kernel_chunk_scan():
            want = m(tokens[0], **{kwarg: cache})
        with served_mixers(model):
            got = m(tokens[0], **{kwarg: carry(SimpleNamespace(), DecodeSlots(torch.tensor(SLOTS[1:] + SLOTS[:1]),
                                                                                 views))})
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-4)


def test_bad_calls_are_refused_in_one_line_and_leave_the_slots(mixer):
    model, m, _ = mixer
    _, views = pooled(model)
    before = views.get(m.layer_idx, "ssm").clone()
    hidden = model.config.hidden_size
    two = DecodeSlots(torch.tensor(SLOTS[:2]), views)
    with pytest.raises(ValueError, match=r"^slot_forward: layer 0: 2 tokens a row, .* expected one token a row"):
        slot_forward(m, torch.zeros(2, 2, hidden), two)
    with pytest.raises(ValueError, match=r"slots \(2,\) for 3 rows"):
        slot_forward(m, torch.zeros(3, 1, hidden), two)
    with pytest.raises(ValueError, match="mask True"):
        slot_forward(m, torch.zeros(2, 1, hidden), two, attention_mask=torch.ones(2, 1))
    assert torch.equal(views.get(m.layer_idx, "ssm"), before)


def test_a_short_conv_model_keeps_the_gathering_decode():
    lm = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**LFM2))
    assert "ShortConv have no in-slot decode path" in slot_ready(lm)
