"""unikv.kernels.ssd: the Triton scan and its einsum reference against the
recurrence they compute token by token (fp64), on strided views as the
Mamba-2 mixer hands them over, in fp32 and bf16; the argument checks."""

import pytest
import torch

from unikv.kernels import ssd
from unikv.kernels.ssd import reference


def recurrence(x, dt, A, B, C, D, dt_bias, initial_states, dt_limit):
    """The scan's definition, one token at a time (fp64), dt' = clamp(
    softplus(dt + bias)) taken as the reference rounds it (in dt's dtype)."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dt = reference.process_dt(dt, dt_bias, True, dt_limit).double()
    x, A, B, C = x.double(), A.double(), B.double(), C.double()
    state = (initial_states.double().clone() if initial_states is not None
             else torch.zeros(b, h, p, n, dtype=torch.float64, device=x.device))
    grp = torch.arange(h, device=x.device) // (h // g)
    ys = []
    for i in range(t):
        Bt, Ct = B[:, i, grp], C[:, i, grp]  # [b, h, n]
        state = (torch.exp(dt[:, i] * A)[..., None, None] * state
                 + (dt[:, i, :, None] * x[:, i])[..., None] * Bt[:, :, None, :])
        y = torch.einsum("bhpn,bhn->bhp", state, Ct)
        ys.append(y + D.double()[:, None] * x[:, i] if D is not None else y)
    return torch.stack(ys, dim=1), state


def inputs(shape, device, dtype=torch.float32, initial=True, strided=True, seed=0):
    """The scan's inputs; `strided`: x, B, C and dt as views into one
    projected tensor, as the mixer's split hands them over."""
    b, t, h, p, g, n, _ = shape
    gen = torch.Generator().manual_seed(seed + sum(shape))
    if strided:
        proj = torch.randn(b, t, h * p + 2 * g * n + h + 3, generator=gen)
        x, B, C, dt, _ = proj.split([h * p, g * n, g * n, h, 3], dim=-1)
        x, B, C = x.view(b, t, h, p), B.view(b, t, g, n), C.view(b, t, g, n)
    else:
        x, dt = torch.randn(b, t, h, p, generator=gen), torch.randn(b, t, h, generator=gen)
        B, C = torch.randn(b, t, g, n, generator=gen), torch.randn(b, t, g, n, generator=gen)
    A, D, bias = -torch.rand(h, generator=gen) * 2, torch.randn(h, generator=gen), torch.randn(h, generator=gen)
    init = torch.randn(b, h, p, n, generator=gen) if initial else None
    move = (lambda v: None if v is None else v.to(device=device))
    x, B, C, dt = (v.to(device=device, dtype=dtype) for v in (x, B, C, dt))
    return x, dt, move(A), B, C, move(D), move(bias), move(init)


CASES = [  # batch, tokens, heads, head dim, groups, state, chunk
    (1, 37, 4, 8, 2, 16, 8), (2, 64, 6, 4, 3, 5, 16), (1, 5, 2, 3, 1, 4, 8), (3, 130, 8, 16, 4, 32, 32),
    (1, 1, 2, 2, 2, 3, 4), (1, 150, 4, 64, 1, 128, 128)]
LIMIT = (0.0, 4.0)


@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("initial", [False, True], ids=["zero", "initial"])
def test_the_kernels_compute_the_recurrence(device, shape, initial):
    x, dt, A, B, C, D, bias, init = inputs(shape, device, initial=initial)
    y, final = ssd.chunk_scan(x, dt, A, B, C, shape[-1], D, bias, init, True, LIMIT, triton=True)
    want, want_final = recurrence(x, dt, A, B, C, D, bias, init, LIMIT)
    assert y.dtype == final.dtype == torch.float32
    assert y.shape == x.shape and final.shape == (*x.shape[:1], *x.shape[2:], B.shape[3])
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-4)
    ref, ref_final = ssd.chunk_scan(x, dt, A, B, C, shape[-1], D, bias, init, True, LIMIT, triton=False)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(final, ref_final, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("shape", [CASES[0], CASES[3], CASES[5]], ids=lambda s: "x".join(map(str, s)))
def test_bf16_inputs_scan_as_the_fp32_reference_of_the_same_values(device, shape):
    """16-bit inputs: dt' is rounded to bf16 where the reference rounds it,
    the sums run in fp32 (TF32 dots on the GPU: about 1e-3 relative)."""
    x, dt, A, B, C, D, bias, init = inputs(shape, device, dtype=torch.bfloat16)
    y, final = ssd.chunk_scan(x, dt, A, B, C, shape[-1], D, bias, init, True, LIMIT, triton=True)
    ref, ref_final = reference.chunk_scan(x, dt, A, B, C, shape[-1], D, bias, init, True, LIMIT)
    tol = 1e-2 if device.type == "cuda" else 1e-5
    assert (y - ref).abs().max() <= tol * ref.abs().max()
    assert (final - ref_final).abs().max() <= tol * ref_final.abs().max()


def test_without_d_bias_or_softplus_and_with_an_open_limit(device):
    shape = CASES[1]
    x, dt, A, B, C, _, _, init = inputs(shape, device, strided=False)
    dt = dt.abs()  # a step without softplus must be >= 0 to decay
    y, final = ssd.chunk_scan(x, dt, A, B, C, shape[-1], initial_states=init, triton=True)
    ref, ref_final = reference.chunk_scan(x, dt, A, B, C, shape[-1], initial_states=init)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(final, ref_final, rtol=1e-4, atol=2e-4)


def test_the_reference_is_the_recurrence():
    shape = CASES[3]
    x, dt, A, B, C, D, bias, init = inputs(shape, "cpu")
    y, final = reference.chunk_scan(x, dt, A, B, C, shape[-1], D, bias, init, True, LIMIT)
    want, want_final = recurrence(x, dt, A, B, C, D, bias, init, LIMIT)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "x": a["x"][0]}, "x has shape"),
    (lambda a: {**a, "B": a["B"][:, :-1]}, "B has shape"),
    (lambda a: {**a, "C": a["C"][..., :3]}, "C has shape"),
    (lambda a: {**a, "dt": a["dt"][:, :-1]}, "dt has shape"),
    (lambda a: {**a, "A": a["A"][:-1]}, "A has shape"),
    (lambda a: {**a, "D": a["D"][None]}, "D has shape"),
    (lambda a: {**a, "initial_states": a["initial_states"][..., 1:]}, "initial_states has shape"),
    (lambda a: {**a, "dt": a["dt"].long()}, "dt must be a float"),
    (lambda a: {**a, "chunk_size": 0}, "chunk_size=0"),
    (lambda a: {**a, "dt_limit": (1.0, 0.5)}, "dt_limit="),
])
def test_bad_arguments_are_refused_in_one_line_naming_them(change, message):
    x, dt, A, B, C, D, bias, init = inputs(CASES[1], "cpu")
    args = dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, D=D, dt_bias=bias, initial_states=init,
                dt_softplus=True, dt_limit=LIMIT)
    with pytest.raises(ValueError, match=message) as err:
        ssd.chunk_scan(**change(args))
    assert "\n" not in str(err.value) and str(err.value).startswith("ssd.chunk_scan: ")


def test_a_state_the_tiles_cannot_hold_runs_the_reference_or_is_refused(device):
    from unikv.kernels.ssd.kernel import MAX_DIM

    x, dt, A, B, C, D, bias, _ = inputs((1, 4, 2, 2, 1, MAX_DIM + 1, 4), device, strided=False)
    with pytest.raises(ValueError, match=f"state size {MAX_DIM + 1} > {MAX_DIM}"):
        ssd.chunk_scan(x, dt, A, B, C, 4, D, bias, None, True, LIMIT, triton=True)
    y, _ = ssd.chunk_scan(x, dt, A, B, C, 4, D, bias, None, True, LIMIT)
    torch.testing.assert_close(y, reference.chunk_scan(x, dt, A, B, C, 4, D, bias, None, True, LIMIT)[0])
