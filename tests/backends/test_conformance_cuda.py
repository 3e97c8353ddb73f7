"""The conformance machine on CudaBackend: the same rules, model and checkers
as tests/property/test_machine.py, on the device buffer, tables and kernels.

On a CUDA device (gpu marker) it runs the session's hypothesis profile (ci:
400 examples x 40 steps per pool kind; deep with HYPOTHESIS_PROFILE=deep).
Everywhere it also runs on the backend's CPU device, its Triton kernels
through the interpreter when Triton is installed, with a small example
budget: the interpreter is slow, and the sim run covers the rules widely.
The random driver runs on both devices too.
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first import of Triton (see tests/kernels/conftest.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from unikv.testing import KINDS, Driver, cuda_backend, make_layout, make_pool  # noqa: E402
from unikv.testing.machine import machine_for  # noqa: E402
from unikv.testing.pools import BOOKKEEPING_KINDS  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
CPU_EXAMPLES = 12  # per pool kind on the CPU device (about 400 rule steps)
# The oracle and vllm refuse a materialised backend (their physical ids are
# bookkeeping only) and CudaBackend always keeps bytes: they run on the sim backend only.
DEVICE_KINDS = [k for k in KINDS if k not in BOOKKEEPING_KINDS]


def machine_settings(device: str) -> settings:
    if device == "cuda":
        return settings()
    return settings(settings(), max_examples=min(CPU_EXAMPLES, settings().max_examples), stateful_step_count=30)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_machine_on_cuda_backend(kind, device):
    run_state_machine_as_test(machine_for(kind, backend=cuda_backend(device)), settings=machine_settings(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_driver_on_cuda_backend(kind, device):
    """Seeded random operations, `Driver.check()` after every one."""
    pool = make_pool(kind, make_layout("mamba|swa|full", 4, 160), backend=cuda_backend(device))
    driver = Driver(pool, random.Random(17))
    assert driver.run(300 if device == "cpu" else 3000) == []
    assert driver.counts["fired"] > 0 and driver.counts["shortfall"] > 0
    assert pool.backend.inner.device.type == device  # the run really was on that device


def test_the_oracle_refuses_cuda_backend():
    from unikv import OraclePool

    with pytest.raises(ValueError, match="no byte layout"):
        make_pool("oracle", make_layout("full", 4, 40), backend=cuda_backend("cpu"))
    assert "oracle" not in DEVICE_KINDS and OraclePool is not None


@pytest.mark.parametrize("device", DEVICES)
def test_machine_on_cuda_backend_bites(device, monkeypatch):
    """A device move kernel that copies nothing is caught by the byte checks."""
    from unikv.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "move_pages", lambda self, buffer, page_bytes, src, dst, disjoint=None: None)
    machine = machine_for("eager", ("up|down", "state|down"), backend=cuda_backend(device))
    with pytest.raises(AssertionError, match="wrong bytes"):
        run_state_machine_as_test(machine, settings=settings(machine_settings(device), max_examples=200,
                                                             phases=[Phase.generate]))
