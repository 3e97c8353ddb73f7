"""unikv.kernels.ssd.update: the Triton decode step against transformers'
own `mamba2_selective_state_update` (fed as the Nemotron-H mixer feeds it:
expanded dt, A, D, dt_bias, strided x, B, C, an fp32 state) in bf16 and
fp32, against the fp64 recurrence, with state_indices into a larger state,
on contiguous and strided views; the argument checks."""

import pytest
import torch

from unikv.kernels.ssd import update
from unikv.kernels.ssd.kernel import MAX_DIM

SHAPES = [(3, 8, 16, 2, 32), (2, 6, 5, 3, 20), (1, 4, 64, 1, 128)]  # batch, heads, head dim, groups, state
BF16_ULP = 2.0 ** -7  # relative spacing of bf16 just above a power of two: one ulp at most


def mixer_args(shape, device, dtype=torch.bfloat16, layout="mixer", seed=0):
    """(state, x, dt, A, B, C, D, dt_bias) as the mixer passes them on decode:
    x, B, C, dt views of one projected row, dt [b, h, 1] expanded over p, A
    [h] fp32 and D, dt_bias [h] expanded, state fp32. `layout`: "mixer";
    "contiguous" (every tensor its own, A, D, dt_bias, dt materialised);
    "strided" (x, B, C every other element of larger tensors)."""
    b, h, p, g, n = shape
    gen = torch.Generator().manual_seed(seed + sum(shape))
    proj = torch.randn(b, h * p + 2 * g * n + h + 3, generator=gen)
    proj[0, -h - 3] = 30.0  # softplus' linear branch (dt + bias > 20)
    proj[-1, -4] = -30.0  # and its far tail
    A, D, bias = -torch.rand(h, generator=gen) * 3, torch.randn(h, generator=gen), torch.randn(h, generator=gen)
    state = torch.randn(b, h, p, n, generator=gen)
    # moved before the views are taken: .to(device) of a view copies it contiguous
    proj, A, D, bias, state = (t.to(device) for t in (proj, A, D, bias, state))
    x, B, C, dt, _ = proj.to(dtype).split([h * p, g * n, g * n, h, 3], dim=-1)
    x, B, C = x.view(b, h, p), B.view(b, g, n), C.view(b, g, n)
    dt = dt[:, None, :].transpose(1, 2).expand(-1, -1, p)
    A = A[:, None, None].expand(-1, p, n)
    D, bias = (t.to(dtype)[:, None].expand(-1, p) for t in (D, bias))
    if layout == "contiguous":
        x, dt, A, B, C, D, bias = (t.contiguous() for t in (x, dt, A, B, C, D, bias))
    elif layout == "strided":
        x, B, C = (torch.stack([t, torch.full_like(t, float("nan"))], dim=-1)[..., 0] for t in (x, B, C))
    return state, x, dt, A, B, C, D, bias


def transformers_update():
    module = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    return module.mamba2_selective_state_update


def run_transformers(state, x, dt, A, B, C, D, bias):
    return transformers_update()(state, x, dt, A, B, C, D, z=None, dt_bias=bias, dt_softplus=True)


def scale(state, C):
    """|state| |C| summed over n per (b, h, p): the size of out's terms."""
    g = C.shape[1]
    return (state.abs() * C.abs().repeat_interleave(state.shape[1] // g, dim=1)[:, :, None]).sum(-1).max()


def assert_bf16_close(got, want, ulps=2):
    assert got.dtype == want.dtype == torch.bfloat16
    diff = (got.float() - want.float()).abs()
    assert (diff <= ulps * BF16_ULP * want.float().abs() + 1e-30).all(), diff.max()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_kernel_is_transformers_update(device, shape, dtype):
    state, x, dt, A, B, C, D, bias = mixer_args(shape, device, dtype)
    assert dt.stride(2) == A.stride(1) == A.stride(2) == D.stride(1) == bias.stride(1) == 0
    theirs = state.clone()
    want = run_transformers(theirs, x, dt, A, B, C, D, bias)
    out = update.state_update(state, x, dt, A, B, C, D, bias, True, triton=True)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(state, theirs, rtol=2e-6, atol=1e-6)
    if dtype == torch.bfloat16:
        assert_bf16_close(out, want)
    else:
        torch.testing.assert_close(out, want, rtol=0, atol=1e-6 * scale(theirs, C).item())


def recurrence(state, x, dt, A, B, C, D, bias):
    """The step's definition in fp64, dt' = softplus(dt + bias)."""
    h, g = x.shape[1], B.shape[1]
    d = torch.nn.functional.softplus((dt + bias).double())
    grp = torch.arange(h, device=x.device) // (h // g)
    Bh, Ch = B.double()[:, grp], C.double()[:, grp]
    new = torch.exp(d[..., None] * A.double()) * state.double() + (d * x.double())[..., None] * Bh[:, :, None]
    return (new * Ch[:, :, None]).sum(-1) + D.double() * x.double(), new


def test_fp32_is_the_fp64_recurrence(device):
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[0], device, torch.float32)
    want, want_state = recurrence(state, x, dt, A, B, C, D, bias)
    out = update.state_update(state, x, dt, A, B, C, D, bias, True, triton=True)
    torch.testing.assert_close(state.double(), want_state, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-6 * scale(want_state, C).item())


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_any_strides(device, layout):
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[1], device, layout=layout)
    assert (layout == "contiguous") == all(t.is_contiguous() for t in (x, dt, A, B, C, D))
    theirs = state.clone()
    want = run_transformers(theirs, x, dt, A, B, C, D, bias)
    out = update.state_update(state, x, dt, A, B, C, D, bias, True, triton=True)
    torch.testing.assert_close(state, theirs, rtol=2e-6, atol=1e-6)
    assert_bf16_close(out, want)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_state_indices_update_their_rows_of_a_larger_state(device, index_dtype):
    _, x, dt, A, B, C, D, bias = mixer_args(SHAPES[0], device)
    gen = torch.Generator().manual_seed(7)
    pool = torch.randn(7, *x.shape[1:], B.shape[2], generator=gen).to(device)
    rows = torch.tensor([5, 0, 3], dtype=index_dtype, device=device)
    before, theirs = pool.clone(), pool.clone()
    want = update.reference_update(theirs, x, dt, A, B, C, D, bias, True, rows)
    out = update.state_update(pool, x, dt, A, B, C, D, bias, True, rows, triton=True)
    untouched = [1, 2, 4, 6]
    assert torch.equal(pool[untouched], before[untouched])
    torch.testing.assert_close(pool, theirs, rtol=2e-6, atol=1e-6)
    assert_bf16_close(out, want)
    gathered = before[rows.long()].clone()  # the reference's own gather -> update -> scatter, by hand
    torch.testing.assert_close(out, update.reference_update(gathered, x, dt, A, B, C, D, bias, True), rtol=0,
                               atol=0)
    assert torch.equal(theirs[rows.long()], gathered)


def test_without_d_bias_or_softplus(device):
    state, x, dt, A, B, C, _, _ = mixer_args(SHAPES[1], device, torch.float32)
    dt = dt.abs()
    theirs = state.clone()
    want = transformers_update()(theirs, x, dt, A, B, C)
    out = update.state_update(state, x, dt, A, B, C, triton=True)
    torch.testing.assert_close(state, theirs, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6 * scale(theirs, C).item())


def test_the_comparisons_catch_a_wrong_rounding_or_group():
    """What the bf16 comparison tells apart: the same step rounded once at
    the end, or with the heads' groups interleaved, is off by more."""
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[0], "cpu")
    want = run_transformers(state.clone(), x, dt, A, B, C, D, bias)
    ours = update.reference_update(state.clone(), x, dt, A, B, C, D, bias, True)
    assert torch.equal(ours, want)
    up = [t.float() for t in (x, dt, B, C, D, bias)]
    late = update.reference_update(state.clone(), up[0], up[1], A, up[2], up[3], up[4], up[5], True)
    swapped = torch.cat([B[:, 1:], B[:, :1]], dim=1)  # head i reading group (i // 4 + 1) % 2
    wrong_group = update.reference_update(state.clone(), x, dt, A, swapped, C, D, bias, True)
    for wrong in (late.bfloat16(), wrong_group):
        with pytest.raises(AssertionError):
            assert_bf16_close(wrong, want)


def test_model_update_runs_the_reference_off_cuda(monkeypatch):
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[1], "cpu")
    from unikv.kernels.ssd import update_kernel

    monkeypatch.setattr(update_kernel, "kernel_update", lambda *a: pytest.fail("the kernel ran on the CPU"))
    theirs = state.clone()
    out = update.model_update(state, x, dt, A, B, C, D, bias, True)
    assert torch.equal(out, update.reference_update(theirs, x, dt, A, B, C, D, bias, True))
    assert torch.equal(state, theirs)


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "x": a["x"][0]}, "x has shape"),
    (lambda a: {**a, "x": a["x"].half()}, "dt has dtype"),
    (lambda a: {**a, "B": a["B"][:, :1].expand(-1, 4, -1)}, "B has shape"),
    (lambda a: {**a, "C": a["C"][..., :3]}, "C has shape"),
    (lambda a: {**a, "dt": a["dt"][:, :, :1]}, "dt has shape"),
    (lambda a: {**a, "dt": a["dt"].long()}, "dt must be a float"),
    (lambda a: {**a, "A": a["A"][:-1]}, "A has shape"),
    (lambda a: {**a, "D": a["D"][0]}, "D has shape"),
    (lambda a: {**a, "D": a["D"].half()}, "D has dtype"),
    (lambda a: {**a, "dt_bias": a["dt_bias"][:, :1]}, "dt_bias has shape"),
    (lambda a: {**a, "state": a["state"][:, :, :-1]}, "state has shape"),
    (lambda a: {**a, "state": a["state"].double()}, "state must be"),
    (lambda a: {**a, "state_indices": torch.zeros(3, dtype=torch.int64)}, "state_indices has shape"),
    (lambda a: {**a, "state_indices": torch.zeros(2)}, "state_indices must be"),
    (lambda a: {**a, "state": a["state"][:1].expand(2, -1, -1, -1)}, "state has strides"),
])
def test_bad_arguments_are_refused_in_one_line_naming_them(change, message):
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[1], "cpu")
    args = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=bias, dt_softplus=True)
    args = change(args)
    before = args["state"].clone()
    with pytest.raises(ValueError, match=message) as err:
        update.state_update(**args)
    assert "\n" not in str(err.value) and str(err.value).startswith("ssd.state_update: ")
    assert torch.equal(args["state"], before)


def test_a_state_the_tile_cannot_hold_is_refused_by_the_kernel(device):
    state, x, dt, A, B, C, D, bias = mixer_args((1, 2, 2, 1, MAX_DIM + 1), device)
    before = state.clone()
    with pytest.raises(ValueError, match=f"state size {MAX_DIM + 1} > {MAX_DIM}"):
        update.state_update(state, x, dt, A, B, C, D, bias, True, triton=True)
    assert torch.equal(state, before)
    update.state_update(state, x, dt, A, B, C, D, bias, True, triton=False)  # the reference takes it


@pytest.mark.gpu
def test_the_kernel_replays_in_a_cuda_graph(device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[0], device)
    rows = torch.tensor([2, 0, 1], device=device)
    pool, theirs = state.clone(), state.clone()
    update.state_update(pool.clone(), x, dt, A, B, C, D, bias, True, rows)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = update.state_update(pool, x, dt, A, B, C, D, bias, True, rows)
    graph.replay()
    want = update.reference_update(theirs, x, dt, A, B, C, D, bias, True, rows)
    torch.testing.assert_close(pool, theirs, rtol=2e-6, atol=1e-6)
    assert_bf16_close(out, want)


def test_a_models_cpu_update_never_imports_triton():
    """`model_update` on CPU tensors runs the reference without importing
    Triton (a torch-only install runs a recurrent model's CPU decode)."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from unikv.kernels.ssd.update import model_update\n"
            "b, h, p, n, g = 2, 4, 3, 8, 2\n"
            "out = model_update(torch.zeros(b, h, p, n), torch.randn(b, h, p), torch.rand(b, h, p),\n"
            "                   -torch.rand(h, p, n), torch.randn(b, g, n), torch.randn(b, g, n))\n"
            "assert out.shape == (b, h, p) and 'triton' not in sys.modules, sorted(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"})
    assert done.returncode == 0, done.stderr[-1500:]


@pytest.mark.gpu
def test_a_compiled_forward_updates_through_the_operator_in_one_graph(device):
    """Inside `torch.compile` (fullgraph: no graph break) the model's update
    (`sim.real.ssd.state_update`, as a compiled one-token prefill chunk of
    Nemotron-H calls it) is the operator `unikv::ssd_state_update`: the
    same output and state as the eager call (dynamo never sees the Triton
    launch, which it cannot trace: "TritonKernelVariable() has no type")."""
    from unikv.sim.real.ssd import state_update

    update.update_op()  # as `kernel_chunk_scan` registers it, before any trace
    torch._dynamo.reset()
    state, x, dt, A, B, C, D, bias = mixer_args(SHAPES[0], device)
    ours, theirs = state.clone(), state.clone()

    def step(state, x, dt, A, B, C, D, bias):
        return state_update(state, x * 1.5, dt, A, B, C, D=D, dt_bias=bias, dt_softplus=True) + 1.0

    compiled = torch.compile(step, backend="inductor" if device.type == "cuda" else "aot_eager", fullgraph=True)
    got = compiled(ours, x, dt, A, B, C, D, bias)
    want = update.model_update(theirs, x * 1.5, dt, A, B, C, D, bias, True) + 1.0
    assert_bf16_close(got, want)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=1e-6)
    assert not torch.equal(ours, state)  # the state was updated in place
