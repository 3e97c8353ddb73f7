"""The Triton paged attention on CUDA: decode and prefill chunks, against HBM bandwidth.

One row per (model shape, layer kind, phase, batch, context, impl), appended
to a long-format CSV: date, device, versions, git revision; the case; the
split count and block sizes the launcher chose; `time_us` (triton.testing
`do_bench`: median, L2 flushed between calls, launch included), `graph_us`
(`do_bench_cudagraph`: device time of the launch replayed from a CUDA
graph), `host_us` (the launcher's Python cost per call, no sync); `bytes`
(the K/V bytes the visible keys occupy + q + out + block tables: what a
kernel must read at least), `gbps` = bytes / graph_us and `hbm_frac` =
gbps / 4800 (H200 HBM3e, 4.8 TB/s); `tflops` = 4 x Hq x D x visible
(query, key) pairs / graph_us; `max_err` and `ok` (the output against the
torch reference on the same inputs, before timing: bf16 tolerance 3e-2).

Impls: `triton` (the launcher's own split choice), `triton_nosplit`
(num_splits=1, for decode rows where the launcher split), `sdpa_dense`
(torch's scaled_dot_product_attention over contiguous dense K/V of the same
shape: flash attention as a yardstick, full-attention layers without
prefix only; it reads no block table).

Model shapes (sim/data/models.json, from the models' config.json):
Gemma-3-12B: 16 q heads, 8 KV heads, head_dim 256, window 1024 (sliding
layers), scale query_pre_attn_scalar ** -0.5 = 1/16; gpt-oss-20b: 64 q heads,
8 KV heads, head_dim 64, window 128 (sliding layers), sinks in every layer.
K/V live on randomly permuted pages (page size 16) of a two-layer,
layer-major page buffer, the layout `unikv.tensors.KVViews` hands out.

    python benchmarks/bench_attention.py --out results/kernels/attention_h200.csv   # on the H200
    python benchmarks/bench_attention.py --smoke --out /tmp/attention_smoke.csv   # anywhere: tiny, interpreted

Without CUDA it refuses (exit 2) unless `--smoke`, which runs two tiny cases
through Triton's interpreter to check the script (times meaningless).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

HBM_GBPS = 4800.0  # H200 HBM3e peak
PAGE_SIZE = 16
FIELDS = ["date", "device", "torch", "triton", "python", "git_rev", "model", "layer", "phase", "batch",
          "context", "q_per_request", "window", "sinks", "impl", "splits", "block_m", "block_n", "time_us",
          "graph_us", "host_us", "bytes", "gbps", "hbm_frac", "tflops", "max_err", "ok"]


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One model's attention heads (see module docstring for the sources)."""

    model: str
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int
    sinks: bool
    scale: float


SHAPES = [Shape(model="gemma-3-12b", q_heads=16, kv_heads=8, head_dim=256, window=1024, sinks=False,
                scale=256 ** -0.5),
          Shape(model="gpt-oss-20b", q_heads=64, kv_heads=8, head_dim=64, window=128, sinks=True,
                scale=64 ** -0.5)]


@dataclass(frozen=True, kw_only=True)
class Case:
    shape: Shape
    layer: str  # "full" or "sliding"
    phase: str  # "decode" or "prefill"
    batch: int
    context: int  # KV tokens per request after the step
    q_per_request: int

    @property
    def window(self) -> int | None:
        return self.shape.window if self.layer == "sliding" else None


def cases(smoke: bool) -> list[Case]:
    """Decode at batch 1/64/256 x context 1k/8k and prefill chunks, per shape and layer kind."""
    if smoke:
        small = Shape(model="smoke", q_heads=4, kv_heads=2, head_dim=64, window=8, sinks=True, scale=0.125)
        return [Case(shape=small, layer="sliding", phase="decode", batch=3, context=40, q_per_request=1),
                Case(shape=small, layer="full", phase="prefill", batch=1, context=24, q_per_request=16)]
    out = []
    for shape in SHAPES:
        for layer in ("full", "sliding"):
            for batch in (1, 64, 256):
                for context in (1024, 8192):
                    out.append(Case(shape=shape, layer=layer, phase="decode", batch=batch, context=context,
                                    q_per_request=1))
            for batch, context, chunk in ((1, 2048, 2048), (1, 8192, 2048), (4, 4096, 1024), (1, 4096, 4096)):
                out.append(Case(shape=shape, layer=layer, phase="prefill", batch=batch, context=context,
                                q_per_request=chunk))
    return out


def inputs(case: Case, dev, gen):
    """(q, k, v, block_table, cu_q, seq_lens, sinks) on `dev`, K/V on permuted pages of a 2-layer buffer."""
    import torch

    s = case.shape
    pages_per = -(-case.context // PAGE_SIZE)
    num_pages = case.batch * pages_per + 1  # page 0: the sink
    layer_elems = PAGE_SIZE * s.kv_heads * s.head_dim
    page_elems = 2 * 2 * layer_elems  # two layers, K and V each
    buf = torch.empty(num_pages * page_elems, dtype=torch.bfloat16, device=dev)
    buf.normal_(generator=None)
    k = buf.as_strided((num_pages, PAGE_SIZE, s.kv_heads, s.head_dim), (page_elems, s.kv_heads * s.head_dim,
                                                                         s.head_dim, 1), 2 * layer_elems)
    v = buf.as_strided(k.shape, k.stride(), 3 * layer_elems)
    table = (torch.randperm(num_pages - 1, generator=gen) + 1).view(case.batch, pages_per).to(torch.int32)
    cu = torch.arange(case.batch + 1, dtype=torch.int32) * case.q_per_request
    seq = torch.full((case.batch,), case.context, dtype=torch.int32)
    q = torch.randn(case.batch * case.q_per_request, s.q_heads, s.head_dim, generator=gen).to(torch.bfloat16)
    sinks = torch.randn(s.q_heads, generator=gen) if s.sinks else None
    return tuple(None if t is None else t.to(dev) for t in (q, k, v, table, cu, seq, sinks))


def visible_pairs(case: Case) -> int:
    """(query, key) pairs the mask lets through, summed over the batch."""
    n, m, w = case.context, case.q_per_request, case.window
    pairs = 0
    for i in range(n - m, n):
        pairs += i + 1 if w is None else min(i + 1, w)
    return case.batch * pairs


def visible_keys(case: Case) -> int:
    """Keys some query of a request sees (what must be read from HBM), summed over the batch."""
    n, m, w = case.context, case.q_per_request, case.window
    return case.batch * (n if w is None else min(n, m - 1 + w))


def min_bytes(case: Case) -> int:
    s = case.shape
    kv = visible_keys(case) * s.kv_heads * 2 * s.head_dim * 2
    qo = 2 * case.batch * case.q_per_request * s.q_heads * s.head_dim * 2
    return kv + qo + case.batch * (-(-case.context // PAGE_SIZE)) * 4


def host_us(fn, calls: int = 50) -> float:
    """The launcher's Python time per call on CUDA (queued launches, one sync at the end)."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def timings(fn, cuda: bool, budget_ms: float) -> tuple[float, float, float]:
    """(time_us, graph_us, host_us) of `fn`; on the CPU (smoke) all three are wall time."""
    if not cuda:
        t0 = time.perf_counter()
        fn()
        us = (time.perf_counter() - t0) * 1e6
        return us, us, us
    from triton.testing import do_bench, do_bench_cudagraph

    t = do_bench(fn, warmup=max(5, budget_ms / 4), rep=budget_ms, return_mode="median") * 1e3
    g = do_bench_cudagraph(fn, rep=budget_ms, return_mode="median") * 1e3
    return t, g, host_us(fn)


def sdpa_call(case: Case, q, dev):
    """Dense flash attention over contiguous K/V of the same shape, or None where it does not apply."""
    import torch

    if case.layer != "full" or case.shape.sinks or case.q_per_request not in (1, case.context):
        return None
    s = case.shape
    k = torch.randn(case.batch, s.kv_heads, case.context, s.head_dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    qq = q.view(case.batch, case.q_per_request, s.q_heads, s.head_dim).transpose(1, 2)
    causal = case.q_per_request > 1
    return lambda: torch.nn.functional.scaled_dot_product_attention(qq, k, v, is_causal=causal, scale=s.scale,
                                                                    enable_gqa=True)


def run_case(case: Case, dev, gen, cuda: bool, budget_ms: float, stamp: dict) -> list[dict]:
    from unikv.kernels.attention import kernel, reference

    q, k, v, table, cu, seq, sinks = inputs(case, dev, gen)
    kw = dict(scale=case.shape.scale, window=case.window, sinks=sinks)
    want = reference.paged_attention(q, k, v, table, cu, seq, **kw).float()
    cfg = kernel.plan(q.shape[0], case.batch, case.shape.q_heads // case.shape.kv_heads, case.shape.head_dim,
                      min(table.shape[1] * PAGE_SIZE, (case.window or 1 << 30) + 128), kernel._sm_count(q.device))
    impls = {"triton": (None, cfg["SPLITS"])}
    if cfg["SPLITS"] > 1:
        impls["triton_nosplit"] = (1, 1)
    rows = []
    base = {**stamp, "model": case.shape.model, "layer": case.layer, "phase": case.phase, "batch": case.batch,
            "context": case.context, "q_per_request": case.q_per_request, "window": case.window or "",
            "sinks": sinks is not None, "block_m": cfg["BLOCK_M"], "block_n": cfg["BLOCK_N"]}
    flops = 4 * case.shape.q_heads * case.shape.head_dim * visible_pairs(case)
    for impl, (splits, shown) in impls.items():
        def call(splits=splits):
            return kernel.paged_attention(q, k, v, table, cu, seq, num_splits=splits, **kw)
        err = float((call().float() - want).abs().max())
        rows.append(_row(base, impl, shown, timings(call, cuda, budget_ms), min_bytes(case), flops, err))
    dense = sdpa_call(case, q, dev) if cuda else None
    if dense is not None:
        rows.append(_row(base, "sdpa_dense", "", timings(dense, cuda, budget_ms), min_bytes(case), flops, None))
    return rows


def _row(base: dict, impl: str, splits, times, nbytes: int, flops: int, err: float | None) -> dict:
    t, g, h = times
    gbps = nbytes / g / 1e3
    return {**base, "impl": impl, "splits": splits, "time_us": round(t, 2), "graph_us": round(g, 2),
            "host_us": round(h, 2), "bytes": nbytes, "gbps": round(gbps, 1), "hbm_frac": round(gbps / HBM_GBPS, 4),
            "tflops": round(flops / g / 1e6, 2), "max_err": "" if err is None else f"{err:.3g}",
            "ok": "" if err is None else err < 3e-2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/kernels/attention.csv")
    ap.add_argument("--smoke", action="store_true", help="two tiny cases; the Triton interpreter without CUDA")
    ap.add_argument("--budget-ms", type=float, default=100.0, help="timing budget per (case, impl) and method")
    ap.add_argument("--only", default=None, help="run the cases whose model/layer/phase contain this string")
    args = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("bench_attention: needs a CUDA device (it times the Triton paged-attention kernel on the GPU); "
              "--smoke checks the script on the CPU", file=sys.stderr)
        return 2
    if not cuda:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_attention: Triton was imported before TRITON_INTERPRET=1 could be set", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module imports Triton
    from bench_kernels import (  # the kernel benchmarks' stamp and CSV appender (this folder)
        stamp_row,
        write_rows,
    )

    dev = torch.device("cuda" if cuda else "cpu")
    gen = torch.Generator().manual_seed(0)
    stamp = stamp_row(cuda)
    for case in cases(args.smoke):
        tag = f"{case.shape.model}/{case.layer}/{case.phase}"
        if args.only and args.only not in tag:
            continue
        rows = run_case(case, dev, gen, cuda, args.budget_ms, stamp)
        if cuda:
            torch.cuda.empty_cache()  # the case's buffers (up to ~34 GB) are freed before the next
        write_rows(args.out, rows, FIELDS)
        for r in rows:
            print(f"{tag:32s} b={case.batch:<4d} ctx={case.context:<5d} q={case.q_per_request:<5d} "
                  f"{r['impl']:15s} splits={r['splits']!s:3s} {r['graph_us']:>9}us graph {r['time_us']:>9}us "
                  f"host {r['host_us']:>6}us {r['gbps']:>7} GB/s ({100 * r['hbm_frac']:.1f}% HBM) "
                  f"{r['tflops']:>7} TFLOP/s err {r['max_err']} ok={r['ok']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
