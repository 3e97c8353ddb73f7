"""``python -m traces ...``: see :mod:`traces.cli`."""

from traces.cli import main

raise SystemExit(main())
