"""The conformance machine on the sim backend, for every pool kind (profile
from tests/conftest.py; the same machine runs on CudaBackend in
tests/backends/test_conformance_cuda.py)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from unikv.testing import KINDS
from unikv.testing.machine import machine_for


@pytest.mark.parametrize("kind", KINDS)
def test_machine_on_sim(kind):
    run_state_machine_as_test(machine_for(kind), settings=settings())


def test_machine_for_rejects_unknown_kinds_and_shapes():
    with pytest.raises(ValueError, match="kind='paged'"):
        machine_for("paged")
    with pytest.raises(ValueError, match="shapes=\\['up\\|up'\\]"):
        machine_for("lazy", ["up|up"])
