"""Session-wide test settings: hypothesis profiles for the conformance
machine, one torch thread, and a report of what the machines reached.

`ci` (the default): derandomised (a fixed seed per test, no example
database), so a CI run is reproducible and never flaky; sized so
tests/property finishes in a few minutes on a 2-core machine.
`deep` (HYPOTHESIS_PROFILE=deep): random seeds, >= 50,000 rule steps over the
four pool kinds; run it before a release or after touching the core.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

try:
    import torch
except ImportError:  # the base install runs without torch
    torch = None

if torch is not None:
    # Small-tensor CPU work is dominated by thread start-up: one intra-op
    # thread is several times faster here (and is what the simulator uses).
    torch.set_num_threads(1)

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
    from unikv.testing.reach import EXAMPLES, REACHED, STEPS

    if not STEPS:
        return
    terminalreporter.write_sep("-", f"conformance machines ({settings.default._current_profile} profile)")
    for name in sorted(STEPS):
        terminalreporter.write_line(f"{name}: {STEPS[name]} rule steps over {EXAMPLES[name]} examples")
    total, examples = sum(STEPS.values()), sum(EXAMPLES.values())
    terminalreporter.write_line(f"total: {total} rule steps over {examples} examples")
    terminalreporter.write_line(f"reached: {dict(REACHED)}")
