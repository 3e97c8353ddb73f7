"""Kernel tests run natively on CUDA, else on the CPU through Triton's interpreter.

`TRITON_INTERPRET=1` must be set before Triton is imported, so it is set
here, at collection, before any test module imports a kernel module.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """CUDA when present; else the CPU, where the kernels must be interpreted."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.importorskip("triton")
    from unikv.kernels import launch
    from unikv.kernels.tables import kernel

    if not launch.interpreted(kernel._bind_kernel):
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set: kernels cannot run on the CPU")
    return torch.device("cpu")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator: inputs are drawn on the CPU, then moved."""
    g = torch.Generator()
    g.manual_seed(1234)
    return g


def moves(shape: str, n: int, num_pages: int, gen):
    """(src, dst) page lists of one batch shape, as int64 CPU tensors."""
    perm = torch.randperm(num_pages, generator=gen)
    if shape == "disjoint":
        return perm[:n], perm[n:2 * n]
    if shape == "shift_down":  # pack a run down over itself by a few pages
        src = torch.arange(num_pages - n, num_pages)
        return src, src - min(3, num_pages - n)
    if shape == "shift_up":
        src = torch.arange(0, n)
        return src, src + min(2, num_pages - n)
    if shape == "compact":  # live pages with holes packed to the bottom, order kept
        src = torch.sort(perm[:n]).values
        return src, torch.arange(n)
    if shape == "cycles":  # sources permuted among themselves
        src = perm[:n]
        return src, src[torch.randperm(n, generator=gen)]
    raise AssertionError(shape)


@pytest.fixture
def move_batch():
    """`moves(shape, n, num_pages, gen)`: the page-move batch shapes."""
    return moves
