"""Plain-torch reference of `paged_attention`: the definition of the op.

One layer's attention for a step's packed queries over K/V pages read
through a block table. Request b owns query rows `cu_q[b]:cu_q[b+1]`, at
positions `seq_lens[b] - q_len_b .. seq_lens[b] - 1`, and sees its keys
`0 .. seq_lens[b] - 1`, whose token j lives on physical page
`block_table[b, j // ps]` at offset `j % ps`. Query i sees key j iff
`j <= i` and, with a window, `i - window < j` (transformers'
`sliding_window_overlay` in masking_utils.py). Scores and softmax in fp32:

    s = scale * q . k
    s = softcap * tanh(s / softcap)                   (Gemma-2 attn_logit_softcapping)
    p = exp(s - m) / (sum exp(s - m) + exp(sink - m)) (gpt-oss sinks: transformers
                                                       gpt_oss eager_attention_forward)
    out = p @ v

Only the keys some query of the request sees are gathered (from the first
query's window start to seq_lens[b]), so block-table entries of pages the
window hides (tombstoned: 0, the sink page) are never read.

The argument checks (`check_args`) are metadata only and shared with the
Triton launcher; the reference also checks the values it reads on the host
(`check_values`).
"""

from __future__ import annotations

import math

import torch

OP = "paged_attention"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def _tensor(t, name: str, dims: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{OP}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{OP}: {name} has shape {tuple(t.shape)}; expected {dims}-D")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{OP}: {name} has dtype {t.dtype}; expected {want}")
    return t


def _cache(t, name: str, q: torch.Tensor) -> None:
    # Any page, slot and head strides (the kernel takes them); each row of
    # head_dim elements must be contiguous.
    _tensor(t, name, 4, (q.dtype,))
    if 0 in t.shape[1:]:
        raise ValueError(f"{OP}: {name} has shape {tuple(t.shape)}; expected non-empty [P, ps, Hkv, D]")
    if t.shape[3] > 1 and t.stride(3) != 1:
        raise ValueError(f"{OP}: {name} has strides {tuple(t.stride())}; expected the last one 1 "
                         "(each head's row contiguous)")


def _scalars(scale, window, softcap) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{OP}: scale={scale!r}; expected a finite float")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ValueError(f"{OP}: window={window!r}; expected None or a positive int (tokens)")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise ValueError(f"{OP}: softcap={softcap!r}; expected None or a positive finite float")


_FLOATS = frozenset(FLOAT_DTYPES)
_INDEX = frozenset(INDEX_DTYPES)


def _fast_ok(q, k, v, table, cu, seq, scale, window, sinks, softcap, out) -> bool:
    """The common call, cheaply (the launcher runs once per layer per step):
    True only where `check_args` would pass; False sends it to the checks
    that name the argument."""
    tensor = torch.Tensor
    if (type(q) is not tensor or type(k) is not tensor or type(v) is not tensor or type(table) is not tensor
            or type(cu) is not tensor or type(seq) is not tensor or out is not None or type(scale) is not float
            or not (window is None or type(window) is int)):
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    dtype, device = q.dtype, q.device
    if sinks is not None and (type(sinks) is not tensor or sinks.dim() != 1 or len(qs) != 3
                              or sinks.shape[0] != qs[1] or sinks.dtype not in _FLOATS or sinks.device != device):
        return False
    if softcap is not None and (type(softcap) is not float or not 0 < softcap < math.inf):
        return False
    return (len(qs) == 3 and len(ks) == 4 and len(vs) == 4 and dtype in _FLOATS and k.dtype is dtype
            and v.dtype is dtype and ks[3] == qs[2] and ks[:3] == vs[:3] and ks[1] > 0 and ks[2] > 0
            and qs[1] % ks[2] == 0 and ks[3] > 0 and vs[3] > 0 and k.stride(3) == 1 and v.stride(3) == 1
            and table.dim() == 2 and cu.dim() == 1 and seq.dim() == 1 and table.dtype in _INDEX
            and cu.dtype in _INDEX and seq.dtype in _INDEX and cu.shape[0] == seq.shape[0] + 1
            and table.shape[0] == seq.shape[0] and math.isfinite(scale) and (window is None or window > 0)
            and k.device == device and v.device == device and table.device == device and cu.device == device
            and seq.device == device)


def check_args(q, k_cache, v_cache, block_table, cu_q, seq_lens, *, scale, window=None, sinks=None,
               softcap=None, out=None) -> None:
    """Refuse bad shapes, dtypes, strides and devices (reads no device memory).

    Raises:
        ValueError: naming the argument, its value and what was expected.
    """
    if _fast_ok(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale, window, sinks, softcap, out):
        return
    _tensor(q, "q", 3, FLOAT_DTYPES)
    _cache(k_cache, "k_cache", q)
    _cache(v_cache, "v_cache", q)
    tokens, hq, dk = q.shape
    pages, ps, hkv, _ = k_cache.shape
    if k_cache.shape[3] != dk:
        raise ValueError(f"{OP}: k_cache head dim {k_cache.shape[3]} != q head dim {dk}")
    if tuple(v_cache.shape[:3]) != (pages, ps, hkv):
        raise ValueError(f"{OP}: v_cache has shape {tuple(v_cache.shape)}; expected [{pages}, {ps}, {hkv}, Dv]"
                         " (k_cache's pages, page size and heads)")
    if hq % hkv:
        raise ValueError(f"{OP}: q has {hq} heads, not a multiple of the caches' {hkv} KV heads")
    _tensor(block_table, "block_table", 2, INDEX_DTYPES)
    _tensor(cu_q, "cu_q", 1, INDEX_DTYPES)
    _tensor(seq_lens, "seq_lens", 1, INDEX_DTYPES)
    batch = seq_lens.shape[0]
    if cu_q.shape[0] != batch + 1:
        raise ValueError(f"{OP}: cu_q has {cu_q.shape[0]} entries; expected len(seq_lens) + 1 = {batch + 1}")
    if block_table.shape[0] != batch:
        raise ValueError(f"{OP}: block_table has {block_table.shape[0]} rows; expected len(seq_lens) = {batch}")
    _scalars(scale, window, softcap)
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table, "cu_q": cu_q,
             "seq_lens": seq_lens}
    if sinks is not None:
        _tensor(sinks, "sinks", 1, FLOAT_DTYPES)
        if sinks.shape[0] != hq:
            raise ValueError(f"{OP}: sinks has shape {tuple(sinks.shape)}; expected [{hq}] (one per q head)")
        named["sinks"] = sinks
    if out is not None:
        _tensor(out, "out", 3, (q.dtype,))
        if tuple(out.shape) != (tokens, hq, v_cache.shape[3]):
            raise ValueError(f"{OP}: out has shape {tuple(out.shape)}; expected "
                             f"{(tokens, hq, v_cache.shape[3])} ([T, Hq, Dv])")
        named["out"] = out
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in named.items())
        raise ValueError(f"{OP}: tensors are on different devices ({where})")


def check_values(q_tokens: int, width: int, ps: int, cu: list[int], seq: list[int]) -> None:
    """Refuse inconsistent batch metadata read on the host (the reference only).

    Raises:
        ValueError: when cu_q does not run from 0 to T without decreasing, a
            request has more queries than KV tokens, or its pages exceed the
            block table's width.
    """
    if cu[0] != 0 or cu[-1] != q_tokens or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{OP}: cu_q={cu}; expected non-decreasing prefix sums from 0 to T={q_tokens}")
    for b, n in enumerate(seq):
        q_len = cu[b + 1] - cu[b]
        if n < q_len:
            raise ValueError(f"{OP}: seq_lens[{b}]={n} < the request's {q_len} queries; expected >= q_len")
        if -(-n // ps) > width:
            raise ValueError(f"{OP}: seq_lens[{b}]={n} needs {-(-n // ps)} pages; block_table has width {width}")


def _request(q, k_cache, v_cache, pages, n, scale, window, sinks, softcap) -> torch.Tensor:
    """One request's attention: q [m, Hq, Dk] at positions n-m .. n-1 -> [m, Hq, Dv] fp32."""
    m, hq, _ = q.shape
    ps, hkv = k_cache.shape[1], k_cache.shape[2]
    qpos = torch.arange(n - m, n, device=q.device)
    lo = 0 if window is None else max(0, n - m - window + 1)  # first key any query sees
    first, last = lo // ps, -(-n // ps)
    ids = pages[first:last].long()
    k = k_cache[ids].flatten(0, 1)[lo - first * ps: n - first * ps].float()
    v = v_cache[ids].flatten(0, 1)[lo - first * ps: n - first * ps].float()
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)  # q head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    kpos = torch.arange(lo, n, device=q.device)
    visible = kpos[None, :] <= qpos[:, None]
    if window is not None:
        visible &= kpos[None, :] > qpos[:, None] - window
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(hq, 1, 1).expand(hq, m, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    cu_q: torch.Tensor, seq_lens: torch.Tensor, *, scale: float, window: int | None = None,
                    sinks: torch.Tensor | None = None, softcap: float | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal paged attention of a step's packed queries (see module docstring).

    Args:
        q: [T, Hq, Dk] query tokens, request b's at rows cu_q[b]:cu_q[b+1].
        k_cache, v_cache: [P, ps, Hkv, Dk] / [P, ps, Hkv, Dv], q's dtype; any
            page stride (any slot and head strides too), each head row contiguous.
        block_table: int32/int64 [B, W], physical page of request b's j-th page.
        cu_q: int32/int64 [B+1] prefix sums of the query counts.
        seq_lens: int32/int64 [B] KV length (tokens) after this step's writes.
        scale: logit scale (usually head_dim ** -0.5).
        window: key j visible from query i iff i - window < j <= i; None: causal only.
        sinks: [Hq] one logit per head joining the softmax denominator only.
        softcap: logits -> softcap * tanh(logits / softcap) before the mask.
        out: [T, Hq, Dv] in q's dtype to write into, or None.
    Returns:
        [T, Hq, Dv] in q's dtype (`out` when given).
    Raises:
        ValueError: naming the argument, for bad shapes, dtypes, strides,
            devices, scalars or batch metadata.
    """
    check_args(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window, sinks=sinks,
               softcap=softcap, out=out)
    cu, seq = cu_q.tolist(), seq_lens.tolist()
    check_values(q.shape[0], block_table.shape[1], k_cache.shape[1], cu, seq)
    result = out if out is not None else q.new_empty(q.shape[0], q.shape[1], v_cache.shape[3])
    for b, n in enumerate(seq):
        if cu[b + 1] > cu[b]:
            rows = slice(cu[b], cu[b + 1])
            result[rows] = _request(q[rows], k_cache, v_cache, block_table[b], n, float(scale), window,
                                    sinks, softcap).to(q.dtype)
    return result
