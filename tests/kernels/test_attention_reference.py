"""unikv.kernels.attention.reference: the torch paged attention against dense attention.

The oracles never see pages: each request's keys and values are dense
tensors, and attention over them is transformers' own eager attention
(Gemma-2's `eager_attention_forward` for plain and soft-capped logits,
gpt-oss's for sinks) or `scaled_dot_product_attention`, with the mask built
from positions. The paged inputs scatter those keys over random physical
pages of a layer-major page buffer (the pool's byte layout: page stride
larger than a layer's K or V), with the sink page, spare pages and pages the
window hides filled with NaN: a read of any of them would show in the output.

`paged_case` and `dense` are shared with test_attention_kernel.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from unikv.kernels import attention
from unikv.kernels.attention import reference


@dataclass(frozen=True, kw_only=True)
class Case:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cu_q: torch.Tensor
    seq_lens: torch.Tensor
    keys: list[torch.Tensor]  # request b's dense K [n, Hkv, Dk]
    values: list[torch.Tensor]

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k_cache, self.v_cache, self.block_table, self.cu_q, self.seq_lens

    def to(self, device) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device) for t in self.args())


def page_buffer(pages: int, ps: int, hkv: int, dk: int, dv: int, dtype, layers: int, layer: int):
    """K and V views of `layer` in a NaN-filled layer-major page buffer."""
    k_elems, v_elems = ps * hkv * dk, ps * hkv * dv
    page = layers * (k_elems + v_elems)
    buf = torch.full((pages * page,), float("nan"), dtype=dtype)
    base = layer * (k_elems + v_elems)
    k = buf.as_strided((pages, ps, hkv, dk), (page, hkv * dk, dk, 1), base)
    v = buf.as_strided((pages, ps, hkv, dv), (page, hkv * dv, dv, 1), base + k_elems)
    return k, v


def paged_case(q_lens, seq_lens, *, ps: int, hq: int, hkv: int, dk: int, dv: int, gen, dtype=torch.float32,
               window: int | None = None, layers: int = 2, layer: int = 1, index_dtype=torch.int32) -> Case:
    """Random queries and dense K/V per request, K/V scattered over random pages.

    Page 0 is the sink; a request's pages entirely before the first key its
    first query sees under `window` are tombstoned (block-table entry 0,
    the physical page left NaN).
    """
    counts = [-(-n // ps) for n in seq_lens]
    num_pages = 1 + sum(counts) + 3  # the sink, the requests' pages, spares
    k_cache, v_cache = page_buffer(num_pages, ps, hkv, dk, dv, dtype, layers, layer)
    phys = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(seq_lens), max(counts, default=0) + 1, dtype=index_dtype)
    keys, values = [], []
    for b, (m, n) in enumerate(zip(q_lens, seq_lens)):
        k = torch.randn(n, hkv, dk, generator=gen).to(dtype)
        v = torch.randn(n, hkv, dv, generator=gen).to(dtype)
        keys.append(k)
        values.append(v)
        first = 0 if window is None else max(0, n - m - window + 1) // ps
        for j in range(counts[b]):
            p = phys.pop()
            if j < first:
                continue  # released out of the window: tombstoned
            table[b, j] = p
            rows = slice(j * ps, min(n, (j + 1) * ps))
            k_cache[p, : rows.stop - rows.start] = k[rows]
            v_cache[p, : rows.stop - rows.start] = v[rows]
    cu = torch.tensor([0, *torch.tensor(list(q_lens), dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, dk, generator=gen).to(dtype)
    return Case(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, cu_q=cu,
                seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32), keys=keys, values=values)


def mask(m: int, n: int, window: int | None) -> torch.Tensor:
    """[m, n] bool: query at position n-m+r sees key j (causal, window)."""
    i = torch.arange(n - m, n)[:, None]
    j = torch.arange(n)[None, :]
    seen = j <= i
    return seen & (j > i - window) if window is not None else seen


def dense(case: Case, *, scale: float, window=None, sinks=None, softcap=None) -> torch.Tensor:
    """[T, Hq, Dv] fp32 by transformers' eager attention over each request's dense K/V."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

    hq, hkv = case.q.shape[1], case.k_cache.shape[2]
    outs = []
    for b, (k, v) in enumerate(zip(case.keys, case.values)):
        q = case.q[int(case.cu_q[b]): int(case.cu_q[b + 1])]
        if len(q) == 0:
            continue
        seen = mask(len(q), len(k), window)
        additive = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))[None, None]
        module = SimpleNamespace(num_key_value_groups=hq // hkv, training=False, head_dim=q.shape[-1],
                                 sinks=None if sinks is None else sinks.float())
        qq, kk, vv = (t.float().transpose(0, 1)[None] for t in (q, k, v))
        if sinks is not None:
            o, _ = gpt_oss_eager(module, qq, kk, vv, additive, scaling=scale)
        else:
            o, _ = gemma2_eager(module, qq, kk, vv, additive, scaling=scale, softcap=softcap)
        outs.append(o[0])
    return torch.cat(outs) if outs else torch.zeros(0, hq, case.v_cache.shape[3])


def run_ref(case: Case, **kw) -> torch.Tensor:
    return reference.paged_attention(*case.args(), **kw)


SHAPE = dict(ps=4, hq=4, hkv=2, dk=16, dv=16)


@pytest.mark.parametrize("seq_lens", [[1], [5, 1, 33, 16], [64, 9]])
def test_decode(seq_lens, gen):
    case = paged_case([1] * len(seq_lens), seq_lens, gen=gen, **SHAPE)
    torch.testing.assert_close(run_ref(case, scale=0.25), dense(case, scale=0.25))


def test_prefill_matches_sdpa(gen):
    case = paged_case([7, 1, 20], [7, 1, 20], gen=gen, **SHAPE)
    got = run_ref(case, scale=0.3)
    want = []
    for b, (k, v) in enumerate(zip(case.keys, case.values)):
        q = case.q[int(case.cu_q[b]): int(case.cu_q[b + 1])].transpose(0, 1)
        kk, vv = (t.transpose(0, 1).repeat_interleave(2, dim=0) for t in (k, v))
        want.append(torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                                     scale=0.3).transpose(0, 1))
    torch.testing.assert_close(got, torch.cat(want))


def test_chunked_prefill_with_cached_prefix(gen):
    case = paged_case([5, 13, 1, 4], [12, 13, 30, 9], gen=gen, **SHAPE)
    torch.testing.assert_close(run_ref(case, scale=0.25), dense(case, scale=0.25))


def test_chunked_equals_whole_prefill(gen):
    """The same request in two chunks (a cached prefix) gives the whole prefill's rows."""
    case = paged_case([11], [11], gen=gen, **SHAPE)
    whole = run_ref(case, scale=0.25)
    for split in (1, 4, 10):
        tail = reference.paged_attention(case.q[split:], case.k_cache, case.v_cache, case.block_table,
                                         torch.tensor([0, 11 - split], dtype=torch.int32), case.seq_lens,
                                         scale=0.25)
        torch.testing.assert_close(tail, whole[split:])


def test_causal_future_keys_change_nothing(gen):
    """Perturbing key/value j changes exactly the queries at positions >= j."""
    case = paged_case([10], [10], gen=gen, **SHAPE)
    before = run_ref(case, scale=0.25)
    j = 6
    page = int(case.block_table[0, j // 4])
    case.k_cache[page, j % 4] += 3.0
    case.v_cache[page, j % 4] -= 2.0
    changed = (run_ref(case, scale=0.25) - before).abs().amax(dim=(1, 2)) > 1e-6
    assert changed.tolist() == [i >= j for i in range(10)]


@pytest.mark.parametrize("window", [1, 3, 4, 7, 40])
def test_window_boundary(window, gen):
    """Query i sees key j iff i - window < j <= i: key i - window is hidden, i - window + 1 seen."""
    n = 16
    case = paged_case([n], [n], gen=gen, **SHAPE)
    before = run_ref(case, scale=0.25, window=window)
    torch.testing.assert_close(before, dense(case, scale=0.25, window=window))
    j = 5
    page = int(case.block_table[0, j // 4])
    case.v_cache[page, j % 4] += 5.0
    changed = (run_ref(case, scale=0.25, window=window) - before).abs().amax(dim=(1, 2)) > 1e-6
    assert changed.tolist() == [i - window < j <= i for i in range(n)]


@pytest.mark.parametrize("window", [2, 5, 8])
def test_tombstoned_pages_hidden_by_window(window, gen):
    """Pages out of every query's window are 0 in the table, their bytes NaN: never read."""
    case = paged_case([1, 3, 2], [40, 27, 9], window=window, gen=gen, **SHAPE)
    assert int((case.block_table[:, :6] == 0).sum()) > 3  # some pages were released
    got = run_ref(case, scale=0.25, window=window)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, dense(case, scale=0.25, window=window))


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
def test_grouped_query_heads(ratio, gen):
    case = paged_case([3, 1], [10, 6], ps=3, hq=2 * ratio, hkv=2, dk=8, dv=8, gen=gen)
    torch.testing.assert_close(run_ref(case, scale=0.35), dense(case, scale=0.35))


def test_grouped_heads_read_their_kv_head(gen):
    """Query head h reads KV head h // (Hq // Hkv): zeroing KV head 1's values zeroes heads 2, 3 only."""
    case = paged_case([4], [4], ps=2, hq=4, hkv=2, dk=8, dv=8, gen=gen)
    case.v_cache[:, :, 1] = 0.0
    got = run_ref(case, scale=0.35)
    assert got[:, 2:].abs().max() == 0 and got[:, :2].abs().min() > 0


def test_sinks_match_gpt_oss_eager(gen):
    case = paged_case([1, 6, 2], [9, 6, 14], gen=gen, **SHAPE)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    got = run_ref(case, scale=0.25, sinks=sinks)
    torch.testing.assert_close(got, dense(case, scale=0.25, sinks=sinks))
    # The sink takes probability mass: the output shrinks towards zero.
    assert not torch.allclose(got, run_ref(case, scale=0.25))


def test_sinks_with_window(gen):
    case = paged_case([2, 5], [30, 12], window=4, gen=gen, **SHAPE)
    sinks = torch.tensor([1.5, -0.5, 0.25, 3.0])
    torch.testing.assert_close(run_ref(case, scale=0.25, window=4, sinks=sinks),
                               dense(case, scale=0.25, window=4, sinks=sinks))


@pytest.mark.parametrize("softcap", [0.5, 4.0, 50.0])
def test_softcap_matches_gemma2_eager(softcap, gen):
    case = paged_case([3, 1], [8, 21], gen=gen, **SHAPE)
    got = run_ref(case, scale=1.0, softcap=softcap)
    torch.testing.assert_close(got, dense(case, scale=1.0, softcap=softcap))
    if softcap < 10:
        assert not torch.allclose(got, run_ref(case, scale=1.0))


def test_dk_differs_from_dv(gen):
    case = paged_case([2, 1], [7, 12], ps=4, hq=4, hkv=1, dk=24, dv=8, gen=gen)
    got = run_ref(case, scale=0.2, window=5)
    assert got.shape == (3, 4, 8)
    torch.testing.assert_close(got, dense(case, scale=0.2, window=5))


@pytest.mark.parametrize("layers,layer", [(1, 0), (3, 0), (3, 2)])
def test_strided_caches(layers, layer, gen):
    case = paged_case([2, 1], [9, 5], layers=layers, layer=layer, gen=gen, **SHAPE)
    assert not case.k_cache.is_contiguous()
    torch.testing.assert_close(run_ref(case, scale=0.25), dense(case, scale=0.25))
    contiguous = reference.paged_attention(case.q, case.k_cache.contiguous(), case.v_cache.contiguous(),
                                           *case.args()[3:], scale=0.25)
    torch.testing.assert_close(contiguous, run_ref(case, scale=0.25))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype, gen):
    case = paged_case([3, 1], [11, 20], dtype=dtype, gen=gen, **SHAPE)
    got = run_ref(case, scale=0.25, softcap=5.0)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), dense(case, scale=0.25, softcap=5.0), atol=1e-2, rtol=1e-2)


def test_int64_metadata_and_empty_requests(gen):
    case = paged_case([0, 2, 0], [5, 3, 1], index_dtype=torch.int64, gen=gen, **SHAPE)
    got = reference.paged_attention(case.q, case.k_cache, case.v_cache, case.block_table,
                                    case.cu_q.long(), case.seq_lens.long(), scale=0.25)
    torch.testing.assert_close(got, dense(case, scale=0.25))


def test_empty_batch(gen):
    case = paged_case([], [], gen=gen, **SHAPE)
    assert run_ref(case, scale=0.25).shape == (0, 4, 16)


def test_out_is_written(gen):
    case = paged_case([2, 1], [5, 8], gen=gen, **SHAPE)
    out = torch.full((3, 4, 16), float("nan"))
    got = run_ref(case, scale=0.25, out=out)
    assert got is out
    torch.testing.assert_close(out, dense(case, scale=0.25))


def test_dispatch_runs_reference_on_cpu(gen):
    case = paged_case([2, 1], [5, 8], gen=gen, **SHAPE)
    want = run_ref(case, scale=0.25, window=3)
    torch.testing.assert_close(attention.paged_attention(*case.args(), scale=0.25, window=3), want)
    torch.testing.assert_close(attention.paged_attention(*case.args(), scale=0.25, window=3, triton=False), want)


def _bad(case: Case):
    """(mutation name, kwargs override, message fragment) for the refusals."""
    q, k, v, table, cu, seq = case.args()
    return [
        ("q", dict(q=q.double()), "q has dtype torch.float64"),
        ("q", dict(q=q[0]), "q has shape"),
        ("q", dict(q=[1.0]), "q must be a torch.Tensor"),
        ("k_cache", dict(k_cache=k.half()), "k_cache has dtype torch.float16"),
        ("k_cache", dict(k_cache=k.transpose(2, 3)), "k_cache has strides"),
        ("k_cache", dict(k_cache=k[..., :8]), "k_cache head dim 8"),
        ("v_cache", dict(v_cache=v[:-1]), "v_cache has shape"),
        ("q", dict(q=q[:, :3]), "not a multiple of the caches' 2 KV heads"),
        ("block_table", dict(block_table=table.float()), "block_table has dtype"),
        ("block_table", dict(block_table=table[:1]), "block_table has 1 rows"),
        ("cu_q", dict(cu_q=cu[:-1]), "cu_q has 2 entries"),
        ("seq_lens", dict(seq_lens=seq.view(2, 1)), "seq_lens has shape"),
        ("cu_q", dict(cu_q=torch.tensor([0, 2, 2], dtype=torch.int32)), "cu_q=\\[0, 2, 2\\]"),
        ("cu_q", dict(cu_q=torch.tensor([0, 3, 2], dtype=torch.int32)), "non-decreasing"),
        ("seq_lens", dict(seq_lens=torch.tensor([1, 8], dtype=torch.int32)), "seq_lens\\[0\\]=1 < the request's 2"),
        ("seq_lens", dict(seq_lens=torch.tensor([5, 99], dtype=torch.int32)), "block_table has width"),
        ("scale", dict(scale=float("nan")), "scale=nan"),
        ("scale", dict(scale=None), "scale=None"),
        ("window", dict(window=0), "window=0"),
        ("window", dict(window=2.5), "window=2.5"),
        ("softcap", dict(softcap=-1.0), "softcap=-1.0"),
        ("sinks", dict(sinks=torch.zeros(3)), "sinks has shape"),
        ("sinks", dict(sinks=torch.zeros(4, dtype=torch.int32)), "sinks has dtype"),
        ("out", dict(out=torch.zeros(3, 4, 8)), "out has shape"),
        ("out", dict(out=torch.zeros(3, 4, 16, dtype=torch.float16)), "out has dtype"),
    ]


BAD_COUNT = 25


@pytest.mark.parametrize("index", range(BAD_COUNT))
@pytest.mark.parametrize("run", [reference.paged_attention, attention.paged_attention], ids=["ref", "dispatch"])
def test_bad_input_refused(index, run, gen):
    case = paged_case([2, 1], [5, 8], gen=gen, **SHAPE)
    cases = _bad(case)
    assert len(cases) == BAD_COUNT
    _, override, message = cases[index]
    kw = dict(zip(("q", "k_cache", "v_cache", "block_table", "cu_q", "seq_lens"), case.args()))
    kw.update(scale=0.25)
    kw.update(override)
    out = kw.get("out")
    before = None if not isinstance(out, torch.Tensor) else out.clone()
    with pytest.raises(ValueError, match=message):
        run(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), kw.pop("block_table"), kw.pop("cu_q"),
            kw.pop("seq_lens"), **kw)
    if before is not None:
        assert torch.equal(out, before)  # nothing written


def test_scale_is_applied(gen):
    case = paged_case([3], [3], gen=gen, **SHAPE)
    assert not torch.allclose(run_ref(case, scale=1 / math.sqrt(16)), run_ref(case, scale=1.0))


def test_fast_check_takes_the_common_call(gen):
    """The per-layer call skips the detailed checks (they only name what is wrong);
    every refusal above still reaches them, so the fast path accepts nothing bad."""
    case = paged_case([2, 1], [5, 8], gen=gen, **SHAPE)
    assert reference._fast_ok(*case.args(), 0.25, None, None, None, None)
    assert reference._fast_ok(*case.args(), 0.25, 4, torch.zeros(4), 5.0, None)
    assert not reference._fast_ok(*case.args(), 0.25, True, None, None, None)  # a bool is no window
    assert not reference._fast_ok(*case.args(), 0.25, None, torch.zeros(3), None, None)
