"""sim.real.ssd: Mamba-2's chunked scan with transformers' signature (the
kernels' reference on the CPU), against the recurrence it computes token by
token and against transformers' own `mamba2_chunk_scan`; its swap into
transformers' module for a block; the opaque operator inside a compiled
trace. The Triton kernels themselves: tests/kernels/test_ssd_kernel.py."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")

from unikv.sim.real import ssd  # noqa: E402


def recurrence(x, dt, A, B, C, D, dt_bias, initial_states, dt_limit):
    """The scan's definition, one token at a time (fp64): with dt' =
    clamp(softplus(dt + bias)), state_t = exp(dt'_t A) state_{t-1} +
    (dt'_t x_t) B_t^T per head, y_t = state_t C_t + D x_t; the heads of a
    group share its B and C."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dt = torch.clamp(torch.nn.functional.softplus((dt + dt_bias).double()), *dt_limit)
    x, A, B, C, D = x.double(), A.double(), B.double(), C.double(), D.double()
    state = initial_states.double().clone() if initial_states is not None else torch.zeros(b, h, p, n, dtype=torch.float64)
    ys = []
    for i in range(t):
        grp = torch.arange(h) // (h // g)
        Bt, Ct = B[:, i, grp], C[:, i, grp]  # [b, h, n]
        decay = torch.exp(dt[:, i] * A)  # [b, h]
        state = decay[..., None, None] * state + (dt[:, i, :, None] * x[:, i])[..., None] * Bt[:, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ct) + D[:, None] * x[:, i])
    return torch.stack(ys, dim=1), state


CASES = [  # batch, tokens, heads, head dim, groups, state, chunk
    (1, 37, 4, 8, 2, 16, 8), (2, 64, 6, 4, 3, 5, 16), (1, 5, 2, 3, 1, 4, 8), (3, 130, 8, 16, 4, 32, 32),
    (1, 1, 2, 2, 2, 3, 4)]


@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_initial", [False, True])
def test_the_scan_is_the_recurrence_and_transformers_own(shape, with_initial):
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    b, t, h, p, g, n, cs = shape
    gen = torch.Generator().manual_seed(sum(shape))
    x, dt = torch.randn(b, t, h, p, generator=gen), torch.randn(b, t, h, generator=gen)
    A, D, bias = -torch.rand(h, generator=gen) * 2, torch.randn(h, generator=gen), torch.randn(h, generator=gen)
    B, C = torch.randn(b, t, g, n, generator=gen), torch.randn(b, t, g, n, generator=gen)
    init = torch.randn(b, h, p, n, generator=gen) if with_initial else None
    limit = (0.0, 4.0)
    kw = dict(chunk_size=cs, D=D, dt_bias=bias, dt_softplus=True, dt_limit=limit, z=None, initial_states=init,
              return_final_states=True)
    out, final = ssd.chunk_scan(x, dt, A, B, C, **kw)
    want, want_final = recurrence(x, dt, A, B, C, D, bias, init, limit)
    assert out.dtype == torch.float32 and out.shape == (b, t, h, p) and final.shape == (b, h, p, n)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-4)
    theirs, theirs_final = mamba2_chunk_scan(x, dt, A, B, C, **kw)
    torch.testing.assert_close(out, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, theirs_final, rtol=1e-4, atol=1e-4)
    only_out = ssd.chunk_scan(x, dt, A, B, C, **{**kw, "return_final_states": False})
    assert torch.equal(only_out, out)


def test_the_swap_holds_for_the_block_only_even_when_it_raises():
    from transformers.models.nemotron_h import modeling_nemotron_h as module

    theirs = module.mamba2_chunk_scan
    with ssd.kernel_chunk_scan():
        assert module.mamba2_chunk_scan is ssd.chunk_scan
    assert module.mamba2_chunk_scan is theirs
    with ssd.einsum_chunk_scan():
        assert module.mamba2_chunk_scan is ssd.reference_chunk_scan
    assert module.mamba2_chunk_scan is theirs
    with pytest.raises(RuntimeError, match="inside"), ssd.kernel_chunk_scan():
        raise RuntimeError("inside")
    assert module.mamba2_chunk_scan is theirs


def test_a_compiled_caller_traces_the_scan_as_one_opaque_operator():
    """Inside `torch.compile` the scan is `unikv::ssd_chunk_scan` (one node
    of the graph, its output shapes from the fake implementation), with
    the eager result."""
    from torch._dynamo.testing import CompileCounterWithBackend

    b, t, h, p, g, n, cs = CASES[3]
    gen = torch.Generator().manual_seed(7)
    x, dt = torch.randn(b, t, h, p, generator=gen), torch.randn(b, t, h, generator=gen)
    A, bias = -torch.rand(h, generator=gen) * 2, torch.randn(h, generator=gen)
    B, C = torch.randn(b, t, g, n, generator=gen), torch.randn(b, t, g, n, generator=gen)
    init = torch.randn(b, h, p, n, generator=gen)

    def mixer_part(x, dt, B, C, init):
        # no D, 130 tokens in chunks of 32: the reference's results are slices; the operator's
        # must still be contiguous, as its fake implementation says (views of them are planned so)
        out, final = ssd.chunk_scan(x * 2, dt, A, B, C, chunk_size=cs, D=None, dt_bias=bias, initial_states=init,
                                    dt_softplus=True, dt_limit=(0.0, 4.0), return_final_states=True)
        if torch.compiler.is_compiling():  # views: the operator's results are contiguous
            return out.view(b, t, -1) + 1, final.view(b, -1)
        return out.reshape(b, t, -1) + 1, final.reshape(b, -1)

    backend = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    ssd.kernel_chunk_scan()  # registers the operator, as the executor's forwards do before any trace
    got = torch.compile(mixer_part, backend=backend, fullgraph=True)(x, dt, B, C, init)
    want = mixer_part(x, dt, B, C, init)
    assert backend.frame_count == 1
    targets = [str(node.target) for gm in backend.graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert sum("ssd_chunk_scan" in t for t in targets) == 1, targets
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_cpu_tensors_scan_through_the_reference_even_under_tritons_interpreter(monkeypatch):
    """The kernels run on CUDA only: under the interpreter (which the
    kernel tests turn on for the whole session) a model's scan on the CPU
    would take minutes, so CPU tensors always take the reference, eagerly
    and through the operator."""
    pytest.importorskip("triton")
    from unikv.kernels import ssd as ssd_kernels
    from unikv.kernels.ssd import kernel, scan_op

    def refuse(*args, **kwargs):
        raise AssertionError("the Triton kernels ran on CPU tensors")

    monkeypatch.setattr(kernel, "chunk_scan", refuse)
    monkeypatch.setattr(ssd_kernels, "runs_triton", lambda *a: True)  # as under the interpreter
    b, t, h, p, g, n, cs = CASES[0]
    gen = torch.Generator().manual_seed(3)
    x, dt = torch.randn(b, t, h, p, generator=gen), torch.randn(b, t, h, generator=gen)
    A, B, C = -torch.rand(h, generator=gen), torch.randn(b, t, g, n, generator=gen), torch.randn(b, t, g, n,
                                                                                                    generator=gen)
    out = ssd.chunk_scan(x, dt, A, B, C, chunk_size=cs)
    y, _ = scan_op()(x, dt, A, B, C, None, None, None, cs, False, 0.0, float("inf"))
    assert out.shape == y.shape == x.shape and torch.equal(out, y)
