"""unikv.kernels.attention.kernel: the Triton paged attention against its torch reference.

On the CPU the kernel runs under Triton's interpreter (tests/kernels/
conftest.py sets TRITON_INTERPRET=1), over a small grid of odd sizes; on
CUDA over a larger one. Inputs come from test_attention_reference.paged_case:
K/V on random pages of a layer-major buffer, NaN in the sink, spare and
tombstoned pages, so a read of a hidden page shows as NaN.
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

pytest.importorskip("triton")

from test_attention_reference import paged_case  # noqa: E402  (tests/kernels is on sys.path)

from unikv.kernels import attention  # noqa: E402
from unikv.kernels.attention import kernel, reference  # noqa: E402

TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=4e-3, rtol=4e-3)}


def compare(q_lens, seq_lens, *, ps, hq, hkv, dk, dv, dtype, device, gen, window=None, sinks=False,
            softcap=None, num_splits=None, index_dtype=torch.int32):
    """Kernel on `device` == reference on the CPU, for one batch."""
    case = paged_case(q_lens, seq_lens, ps=ps, hq=hq, hkv=hkv, dk=dk, dv=dv, dtype=dtype, window=window,
                      gen=gen, index_dtype=index_dtype)
    sink = torch.randn(hq, generator=gen) * 2 if sinks else None
    kw = dict(scale=dk ** -0.5, window=window, softcap=softcap)
    want = reference.paged_attention(*case.args(), sinks=sink, **kw)
    got = kernel.paged_attention(*case.to(device), sinks=None if sink is None else sink.to(device),
                                 num_splits=num_splits, **kw)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])
    return case, got


# (q_lens, seq_lens, ps, hq, hkv, dk, dv, dtype, window, sinks, softcap, num_splits): the CPU grid.
CPU_CASES = [
    ([1, 1, 1, 1, 1], [1, 17, 40, 3, 64], 16, 8, 2, 64, 64, torch.float32, None, False, None, None),
    ([37, 1, 5, 12], [37, 50, 5, 30], 3, 4, 4, 80, 80, torch.float32, None, False, None, None),
    ([1, 6, 1], [45, 20, 9], 1, 8, 1, 128, 128, torch.bfloat16, 7, False, None, None),
    ([3, 1], [21, 33], 16, 2, 1, 256, 256, torch.bfloat16, 1000, False, 50.0, None),
    ([1, 9, 1], [70, 9, 130], 16, 8, 1, 64, 64, torch.float32, 16, True, None, None),
    ([1, 1, 1], [90, 7, 61], 3, 4, 2, 64, 64, torch.float32, None, True, None, 3),
    ([1, 1], [100, 33], 16, 4, 1, 64, 64, torch.bfloat16, 20, True, 5.0, 4),
    ([5, 1, 2], [5, 19, 29], 3, 6, 2, 80, 64, torch.float32, 6, False, 2.0, None),
    ([2, 4], [30, 4], 1, 12, 4, 64, 64, torch.float32, None, False, None, 2),
]


def _ids(case):
    q, n, ps, hq, hkv, dk, dv, dt, w, s, c, sp = case
    return f"q{len(q)}-ps{ps}-h{hq}x{hkv}-d{dk}v{dv}-{str(dt)[6:]}-w{w}-s{int(s)}-c{c}-sp{sp}"


@pytest.mark.parametrize("case", CPU_CASES, ids=[_ids(c) for c in CPU_CASES])
def test_kernel_matches_reference(case, gen, device):
    q, n, ps, hq, hkv, dk, dv, dtype, window, sinks, softcap, splits = case
    compare(q, n, ps=ps, hq=hq, hkv=hkv, dk=dk, dv=dv, dtype=dtype, window=window, sinks=sinks,
            softcap=softcap, num_splits=splits, device=device, gen=gen)


def test_empty_requests_int64_metadata(gen, device):
    compare([0, 3, 0, 1], [4, 10, 1, 6], ps=3, hq=4, hkv=2, dk=64, dv=64, dtype=torch.float32,
            index_dtype=torch.int64, device=device, gen=gen)


def test_splits_more_than_tiles(gen, device):
    """More splits than key tiles: empty splits write (max -1e30, sum 0) and drop out of the combine."""
    compare([1, 1], [5, 70], ps=16, hq=2, hkv=2, dk=64, dv=64, dtype=torch.float32, sinks=True, num_splits=5,
            device=device, gen=gen)


def test_out_and_dispatch(gen, device):
    case = paged_case([2, 1], [9, 20], ps=3, hq=4, hkv=2, dk=64, dv=64, gen=gen)
    args = case.to(device)
    want = reference.paged_attention(*case.args(), scale=0.125, window=5)
    out = torch.full((6, 3, 4, 64), float("nan"), device=device)[:, 0]  # non-contiguous token stride
    got = kernel.paged_attention(*args, scale=0.125, window=5, out=out[:3])
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out[:3].cpu(), want, **TOL[torch.float32])
    assert torch.isnan(out[3:]).all()  # nothing written past T
    strided = torch.full((3, 64, 4), float("nan"), device=device).transpose(1, 2)  # last dim not unit-strided
    kernel.paged_attention(*args, scale=0.125, window=5, out=strided)
    torch.testing.assert_close(strided.cpu(), want, **TOL[torch.float32])
    got = attention.paged_attention(*args, scale=0.125, window=5, triton=True)
    torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])


def test_plan_from_shapes():
    decode = kernel.plan(tokens=64, batch=64, group=8, head_dim=64, key_bound=8192, sm_count=132)
    assert decode["BLOCK_Q"] * 8 == decode["BLOCK_M"] == 16 and decode["SPLITS"] > 1
    big = kernel.plan(tokens=256, batch=256, group=2, head_dim=256, key_bound=8192, sm_count=132)
    assert big["SPLITS"] == 1  # enough programs already
    short = kernel.plan(tokens=1, batch=1, group=2, head_dim=128, key_bound=100, sm_count=132)
    assert short["SPLITS"] == 1  # too few keys to split
    window = kernel.plan(tokens=1, batch=1, group=2, head_dim=256, key_bound=1024 + 128, sm_count=132)
    assert window["SPLITS"] == 18  # Gemma-3's window at batch 1: 18 splits of >= 64 keys, 144 programs
    prefill = kernel.plan(tokens=4096, batch=2, group=4, head_dim=128, key_bound=8192, sm_count=132)
    assert prefill["BLOCK_M"] == 128 and prefill["BLOCK_Q"] == 32 and prefill["SPLITS"] == 1
    assert kernel.plan(tokens=1, batch=1, group=64, head_dim=64, key_bound=10, sm_count=1)["BLOCK_M"] == 64
    fp32 = kernel.plan(tokens=4096, batch=2, group=4, head_dim=128, key_bound=8192, sm_count=132, fp32=True)
    assert (fp32["BLOCK_M"], fp32["BLOCK_N"]) == (16, 16)  # IEEE fp32 dots: smaller tiles, no spills


def test_checks(device):
    q = torch.zeros(2, 4, 64, device=device)
    k = torch.zeros(3, 4, 2, 64, device=device)
    table = torch.zeros(1, 2, dtype=torch.int32, device=device)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=device)
    seq = torch.tensor([2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="num_splits=0"):
        kernel.paged_attention(q, k, k, table, cu, seq, scale=1.0, num_splits=0)
    with pytest.raises(ValueError, match="k_cache has dtype torch.float16"):
        kernel.paged_attention(q, k.half(), k, table, cu, seq, scale=1.0)
    with pytest.raises(ValueError, match="window=-3"):
        kernel.paged_attention(q, k, k, table, cu, seq, scale=1.0, window=-3)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="different devices"):
            kernel.paged_attention(q, k, k, table.cpu(), cu, seq, scale=1.0)


# -- CUDA only: the larger grid --

CUDA_GRID = [(ps, dk, torch.float32 if i % 3 == 2 else torch.bfloat16)
             for i, (ps, dk) in enumerate(itertools.product([1, 3, 16], [64, 80, 128, 256]))]
CUDA_HEADS = [(8, 8), (16, 8), (32, 4), (64, 8), (12, 4)]
CUDA_SETTINGS = [(None, False, None), (64, True, None), (5000, False, 30.0), (7, True, 20.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("index,ps,dk,dtype", [(i, *c) for i, c in enumerate(CUDA_GRID)])
def test_cuda_grid(index, ps, dk, dtype, gen, device):
    """12 cases (page size x head dim; every third fp32), heads and one (window, sinks,
    softcap) setting picked by index, each as a ragged and a decode batch: about 24
    compiled variants, so a bare H200 compiles them in well under a minute."""
    if device.type != "cuda":
        pytest.skip("the large grid runs on CUDA only")
    hq, hkv = CUDA_HEADS[index % len(CUDA_HEADS)]
    window, sinks, softcap = CUDA_SETTINGS[index % len(CUDA_SETTINGS)]
    q_lens = torch.randint(1, 38, (12,), generator=gen).tolist()
    q_lens[::3] = [1] * len(q_lens[::3])
    seq_lens = [m + int(torch.randint(0, 300, (1,), generator=gen)) for m in q_lens]
    for batch in (q_lens, [1] * 9):  # a ragged chunked-prefill batch, a decode batch
        compare(batch, seq_lens[: len(batch)], ps=ps, hq=hq, hkv=hkv, dk=dk, dv=dk, dtype=dtype, window=window,
                sinks=sinks, softcap=softcap, device=device, gen=gen)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 8192), (64, 1000), (256, 300)])
@pytest.mark.parametrize("splits", [None, 7])  # None: auto (32 at batch 1, 1 at batch 256)
def test_cuda_decode(batch, context, splits, gen, device):
    if device.type != "cuda":
        pytest.skip("long-context decode runs on CUDA only")
    seq = torch.randint(1, context, (batch,), generator=gen).tolist()
    compare([1] * batch, seq, ps=16, hq=64, hkv=8, dk=64, dv=64, dtype=torch.bfloat16, window=128, sinks=True,
            num_splits=splits, device=device, gen=gen)
    compare([1] * batch, seq, ps=16, hq=16, hkv=8, dk=256, dv=256, dtype=torch.bfloat16, num_splits=splits,
            softcap=50.0, device=device, gen=gen)


# -- benchmarks/bench_attention.py --


def _bench(monkeypatch):
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))  # its `from bench_kernels import write_rows`
    spec = importlib.util.spec_from_file_location("bench_attention", folder / "bench_attention.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_attention", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_refuses_without_cuda(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark runs")
    assert _bench(monkeypatch).main(["--out", "/nonexistent/x.csv"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_bench_smoke_writes_rows(monkeypatch, tmp_path, device):
    import csv

    out = tmp_path / "attention.csv"
    assert _bench(monkeypatch).main(["--smoke", "--out", str(out), "--budget-ms", "5"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["phase"], r["impl"], r["ok"]) for r in rows] == [("decode", "triton", "True"),
                                                                 ("prefill", "triton", "True")]
    # 3 requests x 8 visible keys (window) x 2 KV heads x (K + V) x 64 x 2 bytes, q + out, 3 table entries each
    assert int(rows[0]["bytes"]) == 3 * 8 * 2 * 2 * 64 * 2 + 2 * 3 * 4 * 64 * 2 + 3 * 3 * 4


# -- the compiled path, without a GPU --

COMPILE_SM90 = r'''
import os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from unikv.kernels.attention import kernel as K

def build(fn, sig, const, warps):
    names = list(fn.arg_names)
    sig = {**sig, **{k: "constexpr" for k in const}}
    src = ASTSource(fn=fn, signature={n: sig[n] for n in names},
                    constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))

ptr = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", table_ptr="*i32", cu_ptr="*i32", seq_ptr="*i32",
           sink_ptr="*fp32", out_ptr="*bf16", acc_ptr="*fp32", ml_ptr="*fp32")
ints = {n: "i32" for n in ("batch", "tokens", "num_heads", "window", "splits", "width", "sq_t", "sq_h", "sk_s", "sk_h",
                           "sv_s", "sv_h", "so_t", "so_h", "st_b")}
ints.update(scale="fp32", softcap="fp32", sk_p="i64", sv_p="i64")
cfg = K.plan(tokens=8, batch=8, group=3, head_dim=80, key_bound=4096, sm_count=132)
assert cfg["SPLITS"] > 1
build(K._attention_kernel, {**ptr, **ints},
      dict(DK=80, DV=64, PS=3, GROUP=3, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_DK=128, BLOCK_DV=64, SPLIT=True, HAS_WINDOW=True,
           HAS_SINKS=True, HAS_SOFTCAP=True, PRECISION="tf32", UPCAST=False), cfg["num_warps"])
build(K._combine_kernel, dict(acc_ptr="*fp32", ml_ptr="*fp32", sink_ptr="*fp32", out_ptr="*bf16", tokens="i32",
                              num_heads="i32", so_t="i32", so_h="i32", splits="i32"),
      dict(DV=64, BLOCK_S=triton.next_power_of_2(cfg["SPLITS"]), BLOCK_DV=64, HAS_SINKS=True), 4)
print("compiled")
'''


def test_compiles_for_sm90_without_a_gpu():
    """The interpreter accepts code the compiler refuses (a plain global read, a
    constexpr reassigned in a loop): compile every switch on, split-KV and the
    combine, for sm_90 through the Triton wheel's ptxas, in a process without
    TRITON_INTERPRET."""
    import os
    import subprocess
    from pathlib import Path

    import triton

    if torch.cuda.is_available():
        pytest.skip("on CUDA the other tests run the compiled kernel itself")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton install has no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", COMPILE_SM90], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_bad_metadata_ends_and_stays_in_bounds(gen, device):
    """The launcher cannot check cu_q / seq_lens values without a device read; a
    huge seq_len or a cu_q past T must still end (keys bounded by the table's
    capacity) and write no row past T."""
    case = paged_case([3], [7], ps=3, hq=4, hkv=2, dk=64, dv=64, gen=gen)
    q, k, v, table, _, _ = case.to(device)
    big = torch.full((6, 4, 64), float("nan"), device=device)
    kernel.paged_attention(q, k, v, table, torch.tensor([0, 50], dtype=torch.int32, device=device),
                           torch.tensor([10**9], dtype=torch.int32, device=device), scale=0.125, out=big[:3])
    assert torch.isnan(big[3:]).all()
