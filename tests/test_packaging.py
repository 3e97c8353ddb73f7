"""The distribution: one import package, every source folder in it."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"unikv": "unikv", "sim": "unikv.sim", "traces": "unikv.traces"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_installed_under_unikv():
    """A folder with an `__init__.py` missing from the packages list would be
    left out of the wheel (the editable install would still find it)."""
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert sorted(found) == sorted(_config()["packages"])


def test_the_folders_map_to_unikv_subpackages():
    assert _config()["package-dir"] == {name: folder for folder, name in FOLDERS.items()}
