"""Fixtures the real executor's tests share."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def one_thread():
    """One torch thread: on 2 shared cores, more threads make tiny forwards 30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gemma():
    """The 3-layer Gemma-3 of the decode-graph tests (window, full, window;
    `test_graphs.gemma3`), attention "unikv", with its layer placement; one
    torch thread while the module runs."""
    from unikv.sim.real.attention import register
    from unikv.sim.real.layers import model_layers

    from tests.sim.real.test_graphs import gemma3

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = gemma3()
    model.set_attn_implementation(register(mask=False))
    yield model, model_layers(model.config, torch.float32)
    torch.set_num_threads(before)
