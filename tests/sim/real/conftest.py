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
