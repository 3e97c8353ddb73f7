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
    from unikv.kernels import launch, triton_tables

    if not launch.interpreted(triton_tables._bind_kernel):
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set: kernels cannot run on the CPU")
    return torch.device("cpu")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator: inputs are drawn on the CPU, then moved."""
    g = torch.Generator()
    g.manual_seed(1234)
    return g
