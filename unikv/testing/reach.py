"""What the conformance machines ran and reached, summed over a session
(tests/conftest.py prints it after the run)."""

from __future__ import annotations

import collections

STEPS: collections.Counter = collections.Counter()  # machine class -> rule steps
EXAMPLES: collections.Counter = collections.Counter()  # machine class -> examples
REACHED: collections.Counter = collections.Counter()  # pool counters, hazard situations, bugs stepped around
