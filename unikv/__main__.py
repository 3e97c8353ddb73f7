"""`python -m unikv ...` is the `unikv` command line."""

from unikv.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
