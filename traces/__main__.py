"""``python -m unikv.traces ...``: see :mod:`traces.cli`."""

from unikv.traces.cli import main

raise SystemExit(main())
