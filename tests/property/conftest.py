"""Hypothesis profiles for the chain fuzzer, and a step report.

`ci` (the default): derandomised (a fixed seed per test, no example
database), so a CI run is reproducible and never flaky; sized so the whole
folder finishes in about two minutes on a 2-core machine.
`deep` (HYPOTHESIS_PROFILE=deep): random seeds, >= 50,000 rule steps over the
four pool kinds; run it before a release or after touching the core.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=400, stateful_step_count=40, derandomize=True,
                          database=None, print_blob=False, **_COMMON)
settings.register_profile("deep", max_examples=1000, stateful_step_count=100, derandomize=False,
                          database=None, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter):
    from chain_machine import EXAMPLES, REACHED, STEPS

    if not STEPS:
        return
    terminalreporter.write_sep("-", f"chain fuzzer ({settings.default._current_profile} profile)")
    for name in sorted(STEPS):
        terminalreporter.write_line(f"{name}: {STEPS[name]} rule steps over {EXAMPLES[name]} examples")
    total, examples = sum(STEPS.values()), sum(EXAMPLES.values())
    terminalreporter.write_line(f"total: {total} rule steps over {examples} examples")
    terminalreporter.write_line(f"reached: {dict(REACHED)}")
