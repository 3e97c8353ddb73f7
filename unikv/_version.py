"""The installed distribution's version."""

from __future__ import annotations

from importlib import metadata


def installed_version() -> str:
    """The version of the installed `unikv` distribution; without one (the
    sources on sys.path, not installed), the package's own `unikv.__version__`."""
    try:
        return metadata.version("unikv")
    except metadata.PackageNotFoundError:
        import unikv

        return unikv.__version__
