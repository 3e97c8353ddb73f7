"""Mamba-2's chunked scan (SSD) as four Triton kernels.

Contract: `unikv.kernels.ssd.reference.chunk_scan` (same arguments, same
results up to rounding). The SSD algorithm (Dao & Gu 2024, section 6) in
the order serving engines run it (vLLM's and SGLang's `mamba_chunk_scan_
combined`, from mamba_ssm), written here from the algorithm:

1. `_dt_kernel`, a program per (sequence, chunk, block of heads): dt' =
   clamp(softplus(dt + bias)) rounded to dt's dtype after the add and the
   softplus (as the reference), and the running sum of dt' A over the
   chunk's tokens. Writes dt' and that sum, fp32, [b, h, c, L] (tokens
   past the sequence's end hold dt' = 0: they decay nothing, add nothing).
2. `_chunk_state_kernel`, a program per (sequence, chunk, head, block of
   head dims): the chunk's own state at its end, sum over its tokens of
   x_l^T (B_l exp(cum_end - cum_l) dt'_l), one `tl.dot` per block of tokens.
3. `_carry_kernel`, a program per (sequence, head, tile of the state): the
   chunks in order, s <- exp(cum_end) s + own state; writes the state
   entering each chunk over the chunk's own (in place) and the final state.
4. `_scan_kernel`, a program per (sequence, chunk, head, block of rows,
   block of head dims): exp(cum_m) C_m S_entering, plus the causal part
   sum_{s <= m} (C_m . B_s) exp(cum_m - cum_s) dt'_s x_s over the blocks of
   tokens up to the row block's end (C B^T formed per block, not stored),
   plus D x_m. Writes fp32.

Precision: every sum accumulates in fp32. With 16-bit inputs, C B^T dots
the inputs as they are (exact products); the dots with a decay-weighted
or carried operand (x^T (B w), (C B^T decay dt') x, C S) take fp32
operands in TF32, where mamba_ssm's kernels round those weights to the
input dtype first: TF32 keeps 3 more mantissa bits, so the scan stays
nearer transformers' fp32 scan, whose tokens the executor's tests compare
against. fp32 inputs dot in IEEE fp32. Triton's interpreter multiplies
16-bit dot operands wrongly (see unikv.kernels.attention.kernel), so under
the interpreter C B^T takes fp32 copies (`UPCAST`).

Limits: the state size n at most MAX_DIM (a tile holds a whole state
row); `unikv.kernels.ssd.chunk_scan` refuses more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from unikv.kernels.launch import cdiv, interpreted, next_pow2

MAX_DIM = 256
"""The largest state size n the kernels' tiles hold."""


@triton.jit
def _round_as(v, kind: tl.constexpr):
    # v (fp32) rounded to `kind` (nearest, ties to even) and back to fp32. bf16 by its bits:
    # Triton's interpreter rounds some fp32 -> bf16 casts the wrong way (triton 3.9)
    if kind == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif kind == tl.float16:
        return v.to(tl.float16).to(tl.float32)
    else:
        return v


@triton.jit
def _dt_kernel(dt_ptr, bias_ptr, a_ptr, dt_out, cum_out, T, H, L, C, lo, hi,
               s_db, s_dt, s_dh,
               HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BL: tl.constexpr, BH: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    hb = tl.program_id(2)
    rows = tl.arange(0, BL)
    heads = hb * BH + tl.arange(0, BH)
    tok = c * L + rows
    live = (rows[:, None] < L) & (tok[:, None] < T) & (heads[None, :] < H)
    raw = tl.load(dt_ptr + b * s_db + tok[:, None] * s_dt + heads[None, :] * s_dh, mask=live, other=0.0)
    kind = dt_ptr.dtype.element_ty
    d = raw.to(tl.float32)
    if HAS_BIAS:
        bias = _round_as(tl.load(bias_ptr + heads, mask=heads < H, other=0.0).to(tl.float32), kind)
        d = _round_as(d + bias[None, :], kind)
    if SOFTPLUS:  # torch's softplus (threshold 20), rounded to dt's dtype
        soft = tl.where(d < -20.0, tl.exp(d), tl.log(1.0 + tl.exp(tl.minimum(d, 20.0))))
        d = _round_as(tl.where(d > 20.0, d, soft), kind)
    d = tl.minimum(tl.maximum(d, lo), hi)
    d = tl.where(live, d, 0.0)
    a = tl.load(a_ptr + heads, mask=heads < H, other=0.0).to(tl.float32)
    cum = tl.cumsum(d * a[None, :], axis=0)
    # [b, h, c, L]
    out = ((b * H + heads[None, :]) * C + c) * L + rows[:, None]
    keep = (rows[:, None] < L) & (heads[None, :] < H)
    tl.store(dt_out + out, d, mask=keep)
    tl.store(cum_out + out, cum, mask=keep)


@triton.jit
def _chunk_state_kernel(x_ptr, b_ptr, dt_ptr, cum_ptr, st_ptr, T, H, L, C, P, N, RATIO,
                        s_xb, s_xt, s_xh, s_xp, s_bb, s_bt, s_bg, s_bn,
                        BK: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)  # (b, c, h)
    h = pid % H
    c = (pid // H) % C
    b = pid // (H * C)
    g = h // RATIO
    ps = tl.program_id(1) * BP + tl.arange(0, BP)
    ns = tl.arange(0, BN)
    base = ((b * H + h) * C + c) * L
    end = tl.load(cum_ptr + base + L - 1)
    acc = tl.zeros([BP, BN], dtype=tl.float32)
    for l0 in range(0, L, BK):
        ls = l0 + tl.arange(0, BK)
        tok = c * L + ls
        live = (ls < L) & (tok < T)
        x = tl.load(x_ptr + b * s_xb + tok[None, :] * s_xt + h * s_xh + ps[:, None] * s_xp,
                    mask=live[None, :] & (ps[:, None] < P), other=0.0)  # [BP, BK]
        bb = tl.load(b_ptr + b * s_bb + tok[:, None] * s_bt + g * s_bg + ns[None, :] * s_bn,
                     mask=live[:, None] & (ns[None, :] < N), other=0.0)  # [BK, BN]
        dt = tl.load(dt_ptr + base + ls, mask=ls < L, other=0.0)
        cum = tl.load(cum_ptr + base + ls, mask=ls < L, other=0.0)
        w = tl.exp(end - cum) * dt
        acc += tl.dot(x.to(tl.float32), bb.to(tl.float32) * w[:, None], input_precision=PRECISION)
    # [b, c, h, p, n]
    out = st_ptr + (((b * C + c) * H + h) * P + ps[:, None]) * N + ns[None, :]
    tl.store(out, acc, mask=(ps[:, None] < P) & (ns[None, :] < N))


@triton.jit
def _carry_kernel(st_ptr, cum_ptr, init_ptr, final_ptr, H, L, C, PN,
                  HAS_INIT: tl.constexpr, BS: tl.constexpr):
    pid = tl.program_id(0)  # (b, h)
    h = pid % H
    b = pid // H
    idx = tl.program_id(1) * BS + tl.arange(0, BS)
    live = idx < PN
    if HAS_INIT:
        s = tl.load(init_ptr + (b * H + h) * PN + idx, mask=live, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BS], dtype=tl.float32)
    for c in range(0, C):
        at = st_ptr + ((b * C + c) * H + h) * PN + idx
        own = tl.load(at, mask=live, other=0.0)
        tl.store(at, s, mask=live)
        decay = tl.exp(tl.load(cum_ptr + ((b * H + h) * C + c) * L + L - 1))
        s = decay * s + own
    tl.store(final_ptr + (b * H + h) * PN + idx, s, mask=live)


@triton.jit
def _scan_kernel(x_ptr, b_ptr, c_ptr, dt_ptr, cum_ptr, st_ptr, d_ptr, y_ptr, T, H, L, C, P, N, RATIO,
                 s_xb, s_xt, s_xh, s_xp, s_bb, s_bt, s_bg, s_bn, s_cb, s_ct, s_cg, s_cn,
                 HAS_D: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr, BP: tl.constexpr,
                 BN: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)  # (b, c, h)
    h = pid % H
    c = (pid // H) % C
    b = pid // (H * C)
    g = h // RATIO
    m0 = tl.program_id(1) * BM
    ps = tl.program_id(2) * BP + tl.arange(0, BP)
    ns = tl.arange(0, BN)
    ms = m0 + tl.arange(0, BM)
    mtok = c * L + ms
    mlive = (ms < L) & (mtok < T)
    base = ((b * H + h) * C + c) * L
    cum_m = tl.load(cum_ptr + base + ms, mask=ms < L, other=0.0)
    cm = tl.load(c_ptr + b * s_cb + mtok[:, None] * s_ct + g * s_cg + ns[None, :] * s_cn,
                 mask=mlive[:, None] & (ns[None, :] < N), other=0.0)  # [BM, BN]
    # the state entering the chunk, [n, p] (stored [p, n])
    st = tl.load(st_ptr + (((b * C + c) * H + h) * P + ps[None, :]) * N + ns[:, None],
                 mask=(ns[:, None] < N) & (ps[None, :] < P), other=0.0)
    acc = tl.dot(cm.to(tl.float32), st, input_precision=PRECISION)
    acc = acc * tl.exp(cum_m)[:, None]
    hi = tl.minimum(m0 + BM, L)
    for s0 in range(0, hi, BS):
        ss = s0 + tl.arange(0, BS)
        stok = c * L + ss
        slive = (ss < L) & (stok < T)
        bs = tl.load(b_ptr + b * s_bb + stok[:, None] * s_bt + g * s_bg + ns[None, :] * s_bn,
                     mask=slive[:, None] & (ns[None, :] < N), other=0.0)  # [BS, BN]
        xs = tl.load(x_ptr + b * s_xb + stok[:, None] * s_xt + h * s_xh + ps[None, :] * s_xp,
                     mask=slive[:, None] & (ps[None, :] < P), other=0.0)  # [BS, BP]
        if UPCAST:  # C B^T of the inputs as they are: exact products, fp32 sums
            cb = tl.dot(cm.to(tl.float32), tl.trans(bs.to(tl.float32)), input_precision=PRECISION)
        else:
            cb = tl.dot(cm, tl.trans(bs), input_precision=PRECISION)  # [BM, BS]
        dt_s = tl.load(dt_ptr + base + ss, mask=ss < L, other=0.0)
        cum_s = tl.load(cum_ptr + base + ss, mask=ss < L, other=0.0)
        causal = (ss[None, :] <= ms[:, None]) & slive[None, :]
        decay = tl.exp(tl.where(causal, cum_m[:, None] - cum_s[None, :], float("-inf")))
        acc += tl.dot(cb * decay * dt_s[None, :], xs.to(tl.float32), input_precision=PRECISION)
    if HAS_D:
        xm = tl.load(x_ptr + b * s_xb + mtok[:, None] * s_xt + h * s_xh + ps[None, :] * s_xp,
                     mask=mlive[:, None] & (ps[None, :] < P), other=0.0)
        acc += tl.load(d_ptr + h).to(tl.float32) * xm.to(tl.float32)
    # [b, t, h, p], contiguous
    out = y_ptr + ((b * T + mtok[:, None]) * H + h) * P + ps[None, :]
    tl.store(out, acc, mask=mlive[:, None] & (ps[None, :] < P))


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, float("inf"))) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan through the kernels (module docstring); arguments and results
    as `reference.chunk_scan`. The caller (`unikv.kernels.ssd.chunk_scan`)
    has checked them."""
    batch, length, heads, head_dim = x.shape
    groups, state = B.shape[2], B.shape[3]
    chunks = cdiv(length, chunk_size)
    dev = x.device
    dt_p = torch.empty((batch, heads, chunks, chunk_size), dtype=torch.float32, device=dev)
    cum = torch.empty_like(dt_p)
    st = torch.empty((batch, chunks, heads, head_dim, state), dtype=torch.float32, device=dev)
    final = torch.empty((batch, heads, head_dim, state), dtype=torch.float32, device=dev)
    y = torch.empty((batch, length, heads, head_dim), dtype=torch.float32, device=dev)
    A = A.contiguous()
    bias = dt_bias.contiguous() if dt_bias is not None else A
    block_l = max(16, next_pow2(chunk_size))
    block_h = min(16, next_pow2(heads))
    _dt_kernel[(batch, chunks, cdiv(heads, block_h))](
        dt, bias, A, dt_p, cum, length, heads, chunk_size, chunks, float(dt_limit[0]), float(dt_limit[1]),
        dt.stride(0), dt.stride(1), dt.stride(2),
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), BL=block_l, BH=block_h)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    upcast = interpreted(_scan_kernel) and x.dtype != torch.float32
    bp, bn = max(16, next_pow2(head_dim)), max(16, next_pow2(state))
    bk = min(64, block_l)
    bpp = min(64, bp)
    _chunk_state_kernel[(batch * chunks * heads, cdiv(head_dim, bpp))](
        x, B, dt_p, cum, st, length, heads, chunk_size, chunks, head_dim, state, heads // groups,
        *x.stride(), *B.stride(), BK=bk, BP=bpp, BN=bn, PRECISION=precision)
    pn = head_dim * state
    block_s = min(1024, next_pow2(pn))
    init = initial_states.contiguous() if initial_states is not None else final
    _carry_kernel[(batch * heads, cdiv(pn, block_s))](
        st, cum, init, final, heads, chunk_size, chunks, pn, HAS_INIT=initial_states is not None, BS=block_s)
    bm = min(64, block_l)
    _scan_kernel[(batch * chunks * heads, cdiv(chunk_size, bm), cdiv(head_dim, bpp))](
        x, B, C, dt_p, cum, st, D if D is not None else A, y, length, heads, chunk_size, chunks, head_dim, state,
        heads // groups, *x.stride(), *B.stride(), *C.stride(),
        HAS_D=D is not None, BM=bm, BS=bm, BP=bpp, BN=bn, PRECISION=precision, UPCAST=upcast)
    return y, final
