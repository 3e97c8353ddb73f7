"""Triton `paged_attention`: flash attention over K/V pages through a block table.

Same result as `unikv.kernels.attention.reference.paged_attention` (the
definition: causal, sliding window, grouped-query heads, sinks, softcap,
Dk != Dv, any page stride), in fp32 accumulation, for fp16 / bf16 / fp32.

Work split (as vLLM's unified Triton attention, vllm/v1/attention/ops/
triton_unified_attention.py: `kernel_unified_attention_2d/3d`,
`find_seq_idx`, `reduce_segments`):

- One program per (query block, KV head, split). A query block holds
  BLOCK_Q consecutive query tokens of one request times the GROUP = Hq / Hkv
  query heads that read the same KV head: BLOCK_M = BLOCK_Q x GROUP rows,
  so each K/V tile is loaded once for the whole group. The grid has
  `T // BLOCK_Q + B` query blocks, an upper bound that needs no query
  length on the host; a program finds its request by binary search over
  `cu_q` (block b of request i is number `cu_q[i] // BLOCK_Q + i + b`) and
  exits when its block is past the request's queries.
- The program walks the keys its rows can see (from the first row's window
  start to the last row's position) in tiles of BLOCK_N tokens, each token's
  page looked up in the block table, with an online softmax (exp2, fp32).
  Keys outside that range are never loaded, so tombstoned table entries
  (pages released out of the window) are never dereferenced for a key.
- Split-KV (decode): when a decode batch has too few programs to fill the
  GPU, the key range is cut into SPLITS parts, each program writes its
  partial (unnormalised acc, max, sum) and a second kernel combines them
  (adding the sink there, once). The split count is chosen from shapes only
  (tokens, batch, block-table width, window, SM count): no device read.

Compile-time constants: the tile sizes, the dtype, the switches (window,
sinks, softcap, split) and the model's constants (head dims, page size, GQA
group: masks on pow2 head dims, the page and row arithmetic fold away; as
runtime ints they cost up to 500 bytes of spills per thread in prefill);
the split count is a runtime int, so split counts share compiled variants.

Triton's interpreter multiplies 16-bit operands of `tl.dot` wrongly (bf16
read as raw integers in triton 3.9), so under the interpreter the dots take
fp32 copies (`UPCAST`); compiled kernels dot 16-bit operands natively.

Sinks join the denominator once: `exp(sink - M)` with M the running max
joined with the sink. Softcap: `softcap * tanh(s / softcap)`, tanh from
exp2 (the interpreter has no tanh).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from unikv.kernels.attention import reference
from unikv.kernels.launch import cdiv, interpreted, next_pow2, runs_triton

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: jit code reads no other globals
MAX_SPLITS = 32
# The fewest keys worth a split of their own. 256 left a 1,152-key window (Gemma-3's
# 1,024 + a tile) with 4 splits, 32 programs on 132 SMs: 18.3 us for a batch-1 decode
# that SDPA on dense K/V does in 8.8 us (results/real/h200/attention.csv, 6fe91e4).
SPLIT_MIN_KEYS = 64


@triton.jit
def _find_request(cu_ptr, g, batch, BLOCK_Q: tl.constexpr):
    # The largest request i whose first query block number cu_q[i] // BLOCK_Q + i is <= g.
    # lo / hi start as int32 tensors: Triton passes an int argument equal to 1 as a
    # constexpr, which a loop could not reassign.
    lo = tl.zeros([], dtype=tl.int32)
    hi = tl.zeros([], dtype=tl.int32) + batch
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_ptr + mid) // BLOCK_Q + mid <= g:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _tanh(x):
    e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))  # in (0, 1]: no overflow; tensor first (the interpreter)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


# Per-call ints are not specialised (Triton compiles a variant per int equal to 1
# or divisible by 16 otherwise): batch sizes and widths change every step.
@triton.jit(do_not_specialize=["batch", "tokens", "window", "splits", "width", "st_b"])
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, cu_ptr, seq_ptr, sink_ptr, out_ptr, acc_ptr, ml_ptr,
    batch, tokens, num_heads, scale, softcap, window, splits, width,
    sq_t, sq_h, sk_p, sk_s, sk_h, sv_p, sv_s, sv_h, so_t, so_h, st_b,
    DK: tl.constexpr, DV: tl.constexpr, PS: tl.constexpr, GROUP: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    g = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    b = _find_request(cu_ptr, g, batch, BLOCK_Q)
    q_begin = tl.load(cu_ptr + b)
    q_end = tl.load(cu_ptr + b + 1)
    t0 = q_begin + (g - (q_begin // BLOCK_Q + b)) * BLOCK_Q
    if t0 < q_end:
        # Bounded by the table's capacity and T, so that bad metadata (which the
        # launcher cannot check without a device read) ends the loop and stays in bounds.
        n = tl.minimum(tl.load(seq_ptr + b), width * PS)
        first = n - (q_end - q_begin)  # position of the request's first query
        r = tl.arange(0, BLOCK_M)
        tok = t0 + r // GROUP
        head = kvh * GROUP + r % GROUP
        row_ok = (r < BLOCK_Q * GROUP) & (tok < q_end) & (tok < tokens)
        qpos = first + (tok - q_begin)
        dk = tl.arange(0, BLOCK_DK)
        dv = tl.arange(0, BLOCK_DV)
        q = tl.load(q_ptr + tok[:, None].to(tl.int64) * sq_t + head[:, None] * sq_h + dk[None, :],
                    mask=row_ok[:, None] & (dk[None, :] < DK), other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        # Keys some row sees: [lo, hi); this split's share of them.
        hi = tl.minimum(first + (t0 - q_begin) + BLOCK_Q, n)
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(first + (t0 - q_begin) - window + 1, 0)
        if SPLIT:
            per = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), splits) * BLOCK_N
            lo = lo + split * per
            hi = tl.minimum(hi, lo + per)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        for start in range(lo, hi, BLOCK_N):
            kpos = start + tl.arange(0, BLOCK_N)
            live = kpos < hi
            page = tl.load(table_ptr + b * st_b + kpos // PS, mask=live, other=0).to(tl.int64)
            slot = kpos % PS
            k = tl.load(k_ptr + page[None, :] * sk_p + slot[None, :] * sk_s + kvh * sk_h + dk[:, None],
                        mask=live[None, :] & (dk[:, None] < DK), other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION) * scale
            if HAS_SOFTCAP:
                s = softcap * _tanh(s / softcap)
            seen = live[None, :] & (kpos[None, :] <= qpos[:, None])
            if HAS_WINDOW:
                seen = seen & (kpos[None, :] > qpos[:, None] - window)
            s = tl.where(seen, s * LOG2E, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + page[:, None] * sv_p + slot[:, None] * sv_s + kvh * sv_h + dv[None, :],
                        mask=live[:, None] & (dv[None, :] < DV), other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        if not SPLIT:
            if HAS_SINKS:
                sink = tl.load(sink_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * LOG2E
                m_f = tl.maximum(m_i, sink)
                keep = tl.exp2(m_i - m_f)
                acc = acc * keep[:, None]
                l_i = l_i * keep + tl.exp2(sink - m_f)
            l_i = tl.where(l_i > 0, l_i, 1.0)
            o = acc / l_i[:, None]
            tl.store(out_ptr + tok[:, None].to(tl.int64) * so_t + head[:, None] * so_h + dv[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < DV))
        else:
            row = (split * tokens + tok).to(tl.int64) * num_heads + head
            tl.store(acc_ptr + row[:, None] * DV + dv[None, :], acc,
                     mask=row_ok[:, None] & (dv[None, :] < DV))
            tl.store(ml_ptr + row * 2, m_i, mask=row_ok)
            tl.store(ml_ptr + row * 2 + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["tokens", "splits"])
def _combine_kernel(acc_ptr, ml_ptr, sink_ptr, out_ptr, tokens, num_heads, so_t, so_h, splits,
                    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    row = (s * tokens + t).to(tl.int64) * num_heads + h
    m = tl.load(ml_ptr + row * 2, mask=s < splits, other=-1.0e30)
    l = tl.load(ml_ptr + row * 2 + 1, mask=s < splits, other=0.0)
    top = tl.max(m, axis=0)
    if HAS_SINKS:
        sink = tl.load(sink_ptr + h).to(tl.float32) * LOG2E
        top = tl.maximum(top, sink)
    w = tl.exp2(m - top)
    denom = tl.sum(l * w, axis=0)
    if HAS_SINKS:
        denom += tl.exp2(sink - top)
    acc = tl.load(acc_ptr + row[:, None] * DV + dv[None, :],
                  mask=(s[:, None] < splits) & (dv[None, :] < DV), other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / denom
    tl.store(out_ptr + t.to(tl.int64) * so_t + h * so_h + dv, o.to(out_ptr.dtype.element_ty), mask=dv < DV)


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tiles(decode: bool, head_dim: int, fp32: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): the largest tiles found to compile for sm_90
    without register spills (triton.compile for GPUTarget("cuda", 90, 32) through
    the wheel's ptxas, docs/kernels.md); fp32's IEEE dots hold more registers."""
    if fp32:
        if not decode and head_dim <= 64:
            return 64, 32, 4
        return 16, 32 if head_dim <= 64 else 16, 4
    if decode:
        return 16, 64 if head_dim <= 64 else 32, 4
    if head_dim <= 64:
        return 128, 64, 8
    if head_dim <= 128:
        return 128, 32, 8
    return 64, 16, 4


def plan(tokens: int, batch: int, group: int, head_dim: int, key_bound: int, sm_count: int,
         num_splits: int | None = None, fp32: bool = False) -> dict[str, int]:
    """Block sizes and split count from shapes alone (no device read).

    Args:
        tokens, batch: T and B of the call; tokens <= 4 x batch is taken as a
            decode-like step (small query blocks, split-KV when the grid is
            small), longer chunks get 64- or 128-row query blocks.
        group: Hq / Hkv. head_dim: max(Dk, Dv).
        key_bound: the most keys one query block can see (block-table
            width x page size, capped by the window).
        sm_count: streaming multiprocessors of the device.
        num_splits: force the split count (tests; None: the heuristic).
        fp32: fp32 inputs (IEEE dots hold more registers: smaller tiles).
    Returns:
        BLOCK_M, BLOCK_Q, BLOCK_N, SPLITS, num_warps.
    """
    decode = tokens <= 4 * batch
    block_m, block_n, warps = _tiles(decode, head_dim, fp32)
    block_m = max(block_m, next_pow2(group))
    block_q = block_m // group
    programs = (tokens // block_q + batch)
    if num_splits is None:
        num_splits = 1
        if decode and programs < 2 * sm_count:
            num_splits = max(1, min(MAX_SPLITS, cdiv(2 * sm_count, max(programs, 1)),
                                    key_bound // SPLIT_MIN_KEYS))
    return dict(BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, SPLITS=num_splits, num_warps=warps)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """`t` when its last dim is unit-strided (the kernels index it so), else a copy."""
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    cu_q: torch.Tensor, seq_lens: torch.Tensor, *, scale: float, window: int | None = None,
                    sinks: torch.Tensor | None = None, softcap: float | None = None,
                    out: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """Causal paged attention on the device (see `reference.paged_attention`).

    One launch (two with split-KV); the checks read metadata only, never
    device memory, so the values of `cu_q` / `seq_lens` / `block_table` are
    trusted (the reference checks them). CPU tensors run the reference
    unless Triton's interpreter is active (`unikv.kernels.launch.runs_triton`).

    Args:
        num_splits: force the split-KV count (>= 1); None picks it from shapes.
    Returns:
        [T, Hq, Dv] in q's dtype (`out` when given).
    Raises:
        ValueError: as the reference's `check_args`, or for a bad num_splits.
    """
    reference.check_args(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window,
                         sinks=sinks, softcap=softcap, out=out)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= 1024):
        raise ValueError(f"paged_attention: num_splits={num_splits!r}; expected None or an int in 1..1024")
    if not runs_triton(_attention_kernel, q):
        return reference.paged_attention(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale,
                                         window=window, sinks=sinks, softcap=softcap, out=out)
    tokens, hq, dk = q.shape
    ps, hkv, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    batch = seq_lens.shape[0]
    result = out if out is not None else q.new_empty(tokens, hq, dv)
    if tokens == 0 or batch == 0:
        return result
    dst = result if result.stride(-1) == 1 or dv == 1 else torch.empty(result.shape, dtype=q.dtype, device=q.device)
    key_bound = block_table.shape[1] * ps if window is None else min(block_table.shape[1] * ps, window + 128)
    cfg = plan(tokens, batch, hq // hkv, max(dk, dv), key_bound, _sm_count(q.device), num_splits,
               fp32=q.dtype == torch.float32)
    _launch(_row_major(q), k_cache, v_cache, _row_major(block_table), cu_q.contiguous(), seq_lens.contiguous(),
            sinks, dst, float(scale), window, softcap, cfg)
    if dst is not result:
        result.copy_(dst)
    return result


def _launch(q, k, v, table, cu, seq, sinks, out, scale, window, softcap, cfg) -> None:
    tokens, hq, dk = q.shape
    ps, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    splits = cfg["SPLITS"]
    if splits > 1:
        acc = torch.empty(splits, tokens, hq, dv, dtype=torch.float32, device=q.device)
        ml = torch.empty(splits, tokens, hq, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # never dereferenced: without SPLIT the program writes `out` directly
    grid = (tokens // cfg["BLOCK_Q"] + seq.shape[0], hkv, splits)
    _attention_kernel[grid](
        q, k, v, table, cu, seq, sinks if sinks is not None else q, out, acc, ml,
        seq.shape[0], tokens, hq, scale, float(softcap or 1.0), int(window or 0), splits, table.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), table.stride(0),
        DK=dk, DV=dv, PS=ps, GROUP=hq // hkv, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_DK=max(16, next_pow2(dk)),
        BLOCK_DV=max(16, next_pow2(dv)), SPLIT=splits > 1, HAS_WINDOW=window is not None, HAS_SINKS=sinks is not None,
        HAS_SOFTCAP=softcap is not None, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=interpreted(_attention_kernel) and q.dtype != torch.float32,
        num_warps=cfg["num_warps"])
    if splits > 1:
        _combine_kernel[(tokens, hq)](
            acc, ml, sinks if sinks is not None else q, out, tokens, hq, out.stride(0), out.stride(1), splits,
            DV=dv, BLOCK_S=next_pow2(splits), BLOCK_DV=max(16, next_pow2(dv)),
            HAS_SINKS=sinks is not None, num_warps=4)
