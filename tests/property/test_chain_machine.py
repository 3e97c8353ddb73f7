"""The chain state machine, run for every pool kind (profile from conftest)."""

from __future__ import annotations

import pytest
from chain_machine import KINDS, machine_for
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test


@pytest.mark.parametrize("kind", KINDS)
def test_chain_machine(kind):
    run_state_machine_as_test(machine_for(kind), settings=settings())
