"""unikv.kernels.attention.op: the K / V write and paged attention as one torch operator.

The operator against its parts (the write by hand, then
`reference.paged_attention`), its fake implementation (`opcheck`), its
refusals, and two layers over one buffer compiled by dynamo + AOTAutograd
(`fullgraph`): the layers' cache views alias one buffer, and every write
must land in it, as eagerly.
"""

from __future__ import annotations

import pytest
import torch

from unikv.kernels.attention import reference
from unikv.kernels.attention.op import attention_op, write_and_attend

PS, HQ, HKV, DK, DV, PAGES, LAYERS = 4, 4, 2, 16, 8, 12, 2
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[CUDA, pytest.mark.gpu])]


def caches(device: str, gen: torch.Generator) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A random layer-major page buffer and each layer's (K, V) `[P, ps, Hkv, D]` views of it."""
    k_elems, v_elems = PS * HKV * DK, PS * HKV * DV
    page = LAYERS * (k_elems + v_elems)
    buf = torch.randn(PAGES * page, generator=gen).to(device)
    views = []
    for layer in range(LAYERS):
        base = layer * (k_elems + v_elems)
        views.append((buf.as_strided((PAGES, PS, HKV, DK), (page, HKV * DK, DK, 1), base),
                      buf.as_strided((PAGES, PS, HKV, DV), (page, HKV * DV, DV, 1), base + k_elems)))
    return buf, views


def decode_step(device: str, gen: torch.Generator) -> dict:
    """Three requests decoding one token each: their tables, lengths, the new tokens' slots and K / V."""
    seq = [5, 9, 2]
    table = torch.tensor([[3, 7, 0], [1, 4, 9], [11, 0, 0]], dtype=torch.int32)
    slots = torch.tensor([int(table[b, (n - 1) // PS]) * PS + (n - 1) % PS for b, n in enumerate(seq)])
    return dict(q=torch.randn(3, HQ, DK, generator=gen).to(device), key=torch.randn(3, HKV, DK, generator=gen).to(device),
                value=torch.randn(3, HKV, DV, generator=gen).to(device), slots=slots.to(device),
                block_table=table.to(device), cu_q=torch.arange(4, dtype=torch.int32, device=device),
                seq_lens=torch.tensor(seq, dtype=torch.int32, device=device))


def by_hand(step: dict, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    s = step["slots"]
    k[s // PS, s % PS] = step["key"]
    v[s // PS, s % PS] = step["value"]
    return reference.paged_attention(step["q"], k, v, step["block_table"], step["cu_q"], step["seq_lens"], **kw)


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(7)
    return g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window, sinks", [(None, False), (3, False), (None, True)])
def test_the_op_writes_the_rows_then_attends_as_its_parts_do(device, gen, window, sinks):
    buf, views = caches(device, gen)
    step = decode_step(device, gen)
    kw = dict(scale=DK ** -0.5, window=window, sinks=torch.randn(HQ, generator=gen).to(device) if sinks else None)
    want_buf = buf.clone()
    k, v = views[1]
    want = by_hand(step, want_buf.as_strided(k.shape, k.stride(), k.storage_offset()),
                   want_buf.as_strided(v.shape, v.stride(), v.storage_offset()), **kw)
    got = write_and_attend(step["q"], step["key"], step["value"], k, v, step["slots"], step["block_table"],
                           step["cu_q"], step["seq_lens"], **kw)
    assert torch.equal(buf, want_buf)  # the rows at their slots, nothing else
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_fake_implementation_gives_the_output_shape(gen):
    _, views = caches("cpu", gen)
    step = decode_step("cpu", gen)
    k, v = views[0]
    s = step["slots"]
    args = (step["q"], step["key"], step["value"], k, v, s // PS, s % PS, step["block_table"], step["cu_q"],
            step["seq_lens"], None, DK ** -0.5, None, None, False)
    torch.library.opcheck(attention_op(), args, test_utils=("test_faketensor",))


@pytest.mark.parametrize("bad, match", [
    (dict(key=torch.zeros(3, HKV + 1, DK)), "key is \\(3, 3, 16\\)"),
    (dict(value=torch.zeros(2, HKV, DV)), "value is \\(2, 2, 8\\)"),
    (dict(slots=torch.zeros(2, dtype=torch.int64)), "pages has shape \\(2,\\)"),
    (dict(seq_lens=torch.ones(2, dtype=torch.int32)), "cu_q has 4 entries"),
])
def test_bad_rows_are_refused_before_anything_is_written(gen, bad, match):
    buf, views = caches("cpu", gen)
    step = {**decode_step("cpu", gen), **bad}
    before = buf.clone()
    k, v = views[0]
    with pytest.raises(ValueError, match=match):
        write_and_attend(step["q"], step["key"], step["value"], k, v, step["slots"], step["block_table"],
                         step["cu_q"], step["seq_lens"], scale=1.0)
    assert torch.equal(buf, before)


def test_two_layers_over_one_buffer_compiled_write_what_eager_writes(gen):
    """dynamo + AOTAutograd (`aot_eager`, `fullgraph`): the operator stays one
    call per layer, and both layers' rows reach the shared buffer."""
    buf, views = caches("cpu", gen)
    step = decode_step("cpu", gen)
    attention_op()  # registered before dynamo traces a call

    def two_layers(q, key, value):
        for k, v in views:
            out = write_and_attend(q, key, value, k, v, step["slots"], step["block_table"], step["cu_q"],
                                   step["seq_lens"], scale=DK ** -0.5, triton=False)
            q = torch.sin(out[..., :1]).expand(-1, -1, DK) + q  # the next layer's queries depend on this one's output
        return q

    start = buf.clone()
    want = two_layers(step["q"], step["key"], step["value"])
    want_buf = buf.clone()
    buf.copy_(start)
    got = torch.compile(two_layers, backend="aot_eager", fullgraph=True)(step["q"], step["key"], step["value"])
    assert torch.equal(got, want) and torch.equal(buf, want_buf) and not torch.equal(buf, start)
