"""CudaBackend's `move_programs`: page moves on a bounded grid of programs.

The pool's moves must stay exact (lockstep with SimBackend, every byte) and
every launch must receive the bound; a bad bound is refused at construction.
On the CPU the Triton kernels run through the interpreter (see
tests/kernels/conftest.py); with a GPU, natively on it (CPU tensors there
take the torch fallback: Triton was imported without the interpreter);
without Triton the torch fallback ignores it.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first import of Triton (see tests/kernels/conftest.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_cuda_backend import CUDA, Lockstep  # noqa: E402  (pytest puts this folder on sys.path)

from unikv.backends.cuda import CudaBackend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the Triton kernel runs


def spy_launches(monkeypatch) -> list:
    """The `max_programs` of every `copy_rows` launch from now on."""
    triton_move = pytest.importorskip("unikv.kernels.move.kernel")
    seen = []
    real = triton_move.copy_rows

    def spy(*args, **kw):
        seen.append(kw.get("max_programs"))
        return real(*args, **kw)

    monkeypatch.setattr(triton_move, "copy_rows", spy)
    return seen


@pytest.mark.parametrize("compaction", ["lazy", "eager"])
def test_bounded_moves_keep_the_pool_exact(compaction, monkeypatch):
    backend = CudaBackend(DEVICE, move_programs=2)
    if not backend.ops.triton:
        pytest.skip("no Triton: the torch fallback has no grid")
    seen = spy_launches(monkeypatch)
    Lockstep(backend, compaction, seed=7 if compaction == "lazy" else 11).run(steps=120)
    assert seen and set(seen) == {2}, f"launches got max_programs {sorted(set(seen), key=str)}"


def test_default_is_a_full_grid(monkeypatch):
    backend = CudaBackend(DEVICE)
    if not backend.ops.triton:
        pytest.skip("no Triton: the torch fallback has no grid")
    seen = spy_launches(monkeypatch)
    Lockstep(backend, "eager", seed=11).run(steps=60)
    assert backend.move_programs is None and seen and set(seen) == {None}


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "8", torch.tensor(4)])
def test_bad_move_programs_is_refused(bad):
    with pytest.raises(ValueError, match=r"CudaBackend: move_programs=.* must be a positive int or None"):
        CudaBackend("cpu", move_programs=bad)


def test_move_programs_is_keyword_only():
    with pytest.raises(TypeError):
        CudaBackend("cpu", None, 4)  # type: ignore[misc]


@pytest.mark.gpu
@CUDA
def test_bounded_moves_on_a_side_stream(monkeypatch):
    """The documented set-up on a GPU: the pool on its own (default-priority)
    stream, every move launch on at most 4 programs, exact in lockstep."""
    seen = spy_launches(monkeypatch)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        Lockstep(CudaBackend("cuda", stream=side, move_programs=4), "lazy", seed=5).run(steps=80)
    torch.cuda.synchronize()
    assert seen and set(seen) == {4}
