"""StateViews: per-layer state tensors over a pool's state band, row = slot."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import CudaBackend, SimBackend  # noqa: E402
from unikv.tensors import LayerState, StateViews  # noqa: E402

CONV = (6, 3)  # bf16: 36 bytes
SSM = (2, 4, 4)  # fp32: 128 bytes
ENTRY = 2 * (36 + 128)


def layer(i: int, band: str = "mamba", conv_dtype=torch.bfloat16) -> LayerState:
    return LayerState(i, band, (("conv", CONV, conv_dtype), ("ssm", SSM, torch.float32)))


BACKENDS = ["sim", "cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def make_pool(compaction: str = "eager", entry: int = ENTRY, backend: str = "sim") -> UnifiedPool:
    layout = Layout(total_bytes=64 * 1024, bands=[
        Band("mamba", entry_bytes=entry, grow="up", unit="request"),
        Band("full", entry_bytes=64, grow="down", page_size=4, blocks_per_page=2),
    ])
    be = SimBackend(materialize=True) if backend == "sim" else CudaBackend(backend)
    return UnifiedPool(layout, be, compaction=compaction)


def fill(views: StateViews, slots, seed: int) -> dict:
    """Writes seeded random state into `slots`; returns what was written per (layer, name)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for lyr in views.layers:
        for name, shape in (("conv", CONV), ("ssm", SSM)):
            t = views.get(lyr, name)
            val = torch.randn((len(slots), *shape), generator=g).to(device=t.device, dtype=t.dtype)
            t[torch.as_tensor(slots, device=t.device)] = val
            out[(lyr, name)] = val
    return out


def test_round_trip_and_slot_bytes_are_layer_major():
    pool = make_pool()
    views = StateViews(pool, [layer(2), layer(0)])
    assert views.layers == (0, 2)
    assert [views.offset_bytes(0, "conv"), views.offset_bytes(0, "ssm"),
            views.offset_bytes(2, "conv"), views.offset_bytes(2, "ssm")] == [0, 36, 164, 200]
    slots = pool.translate(pool.alloc_state("mamba", 3), "mamba")
    wrote = fill(views, slots, seed=1)
    rows = pool.buffer_view("mamba")
    for (lyr, name), val in wrote.items():
        assert torch.equal(views.get(lyr, name)[torch.as_tensor(slots)], val)
        off = views.offset_bytes(lyr, name)
        raw = rows[slots, off:off + val[0].numel() * val.element_size()]
        assert np.array_equal(raw, val.view(torch.uint8).reshape(len(slots), -1).numpy())


def test_state_writes_leave_token_band_bytes_alone():
    pool = make_pool()
    views = StateViews(pool, [layer(0), layer(1)])
    tokens = pool.alloc(16)
    states = pool.alloc_state("mamba", 5)
    tok_rows = pool.buffer_view("full")
    tok_slots = pool.translate(tokens, "full")
    tok_rows[tok_slots] = 0xAB
    fill(views, pool.translate(states, "mamba"), seed=2)
    assert (tok_rows[tok_slots] == 0xAB).all()
    # the whole state slot and nothing outside it changed
    buf = pool.buffer
    written = np.zeros(len(buf), dtype=bool)
    for s in pool.translate(states, "mamba"):
        written[s * ENTRY:(s + 1) * ENTRY] = True
    assert not buf[~written & (buf != 0) & (buf != 0xAB)].size


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compaction", ["eager", "lazy"])
def test_state_follows_its_slot_through_free_and_compaction(compaction, backend):
    pool = make_pool(compaction, backend=backend)
    views = StateViews(pool, [layer(0), layer(1)])
    ssm = views.get(0, "ssm")
    ptr = ssm.data_ptr()
    ids = pool.alloc_state("mamba", 4)
    wrote = fill(views, pool.translate(ids, "mamba"), seed=3)
    before = pool.translate(ids[3:], "mamba")
    pool.free_state("mamba", ids[:1])
    pool.flush(urgent=True)
    after = pool.translate(ids[3:], "mamba")
    assert after[0] != before[0], "the top slot was expected to move into the freed hole"
    survivors = pool.translate(ids[1:], "mamba")
    assert views.get(0, "ssm").data_ptr() == ptr  # the views never change
    for (lyr, name), val in wrote.items():
        view = views.get(lyr, name)
        assert torch.equal(view[torch.as_tensor(survivors, device=view.device)], val[1:])


def test_views_over_a_torch_buffer_share_its_memory():
    pool = make_pool()
    pool.buffer = torch.from_numpy(pool.buffer)  # what CudaBackend hands out: a uint8 tensor
    views = StateViews(pool, [layer(0), layer(1)])
    views.get(1, "ssm")[7] = 1.5
    row = pool.buffer[7 * ENTRY + views.offset_bytes(1, "ssm"):][:4].view(torch.float32)
    assert row.item() == 1.5


@pytest.mark.parametrize(("layers", "entry", "needle"), [
    ([layer(0)], ENTRY, "take 164 bytes per slot (alignment included); expected the band's entry_bytes=328"),
    ([layer(0, band="nope")], ENTRY, "unknown band 'nope'"),
    ([layer(0, band="full")], ENTRY, "band 'full' is a token band"),
    ([layer(0), layer(0)], ENTRY, "layer 0 is listed twice"),
    ([LayerState(0, "mamba", (("a", (3,), torch.bfloat16), ("b", (1,), torch.float32)))], 10,
     "tensor 'b' (torch.float32, 4 bytes) is misaligned: entry_bytes=10"),
    ([], ENTRY, "layers=[]"),
])
def test_refusals_name_the_band_or_layer(layers, entry, needle):
    pool = make_pool(entry=entry)
    with pytest.raises(ValueError, match="^StateViews: .*" + _escape(needle)):
        StateViews(pool, layers)


def test_alignment_padding_counts_toward_entry_bytes():
    # bf16 (3,) takes 6 bytes; the fp32 after it starts at byte 8, so a slot is 12
    spec = LayerState(0, "mamba", (("a", (3,), torch.bfloat16), ("b", (1,), torch.float32)))
    views = StateViews(make_pool(entry=12), [spec])
    assert views.offset_bytes(0, "b") == 8


def test_unmaterialised_buffer_is_refused():
    layout = make_pool().layout
    pool = UnifiedPool(layout, SimBackend(materialize=False))
    with pytest.raises(ValueError, match="^StateViews: pool.buffer=None"):
        StateViews(pool, [layer(0), layer(1)])


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"layer": -1}, "layer=-1 must be an integer >= 0"),
    ({"band": ""}, "band='' must be a non-empty string"),
    ({"tensors": ()}, "tensors=() must be a non-empty tuple"),
    ({"tensors": (("a", (0,), torch.float32),)}, "tensor 'a' shape=(0,) must be a tuple of positive ints"),
    ({"tensors": (("a", (2,), "fp32"),)}, "tensor 'a' dtype='fp32' must be a torch.dtype"),
    ({"tensors": (("a", (2,), torch.float32), ("a", (2,), torch.float32))}, "repeat a name"),
])
def test_layer_state_refuses_bad_fields(kwargs, needle):
    args = {"layer": 0, "band": "mamba", "tensors": (("a", (2,), torch.float32),)} | kwargs
    with pytest.raises(ValueError, match=_escape(needle)):
        LayerState(**args)


def test_unknown_layer_or_name_is_refused():
    views = StateViews(make_pool(), [layer(0), layer(1)])
    with pytest.raises(ValueError, match="layer=5 has no state; layers are \\[0, 1\\]"):
        views.get(5, "ssm")
    with pytest.raises(ValueError, match="layer 0 has no tensor 'x'; it has \\['conv', 'ssm'\\]"):
        views.get(0, "x")


def _escape(text: str) -> str:
    import re

    return re.escape(text)
