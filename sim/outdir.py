"""Output folders written whole: a reader sees a previous complete run or
the new complete run, never a truncated table or a mix of the two.

`staged_dir` writes into a fresh hidden sibling of the output folder and
swaps it in with renames (same file system) once every file is written;
`check_out_dir` refuses an output location that cannot be written before
any simulation starts.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

STAGING_MARK = ".unikv-staging-"
"""Infix of the temporary sibling folders `staged_dir` writes into."""
RUN_MARKERS = ("summary.json", "comparison.csv")
"""A folder holding one of these is a previous unikv output: `staged_dir` may replace it."""


def check_out_dir(out_dir: Path) -> Path:
    """Check, before anything runs, that `out_dir` can be (re)written.

    Returns:
        `out_dir` made absolute.

    Raises:
        ValueError: `out_dir` is a file, lies under a file, is a folder that
            holds something other than a previous unikv output, or no
            folder can be made in its nearest existing parent (permission,
            read-only file system).
    """
    out_dir = Path(out_dir).absolute()
    if out_dir.is_symlink():  # write where it points: renaming the link would orphan it
        out_dir = out_dir.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir}: it is an existing file, not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) \
            and not any((out_dir / m).exists() for m in RUN_MARKERS):
        raise ValueError(f"--out {out_dir}: the folder holds files that are not a unikv run "
                         f"(no {' or '.join(RUN_MARKERS)}); a run replaces its folder whole, so give "
                         "a new or empty folder or a previous run's")
    parent = out_dir.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--out {out_dir}: {parent} is a file, so no folder can be made under it")
    _probe(parent, out_dir)
    return out_dir


def _probe(parent: Path, out_dir: Path) -> None:
    """Make and remove a folder in `parent`: the one test of writability that
    also holds for root, read-only mounts and pseudo file systems."""
    probe = parent / f".{out_dir.name}{STAGING_MARK}{os.getpid()}-probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise ValueError(f"--out {out_dir}: cannot make a folder in {parent} "
                         f"({exc.strerror or exc})") from None


@contextlib.contextmanager
def staged_dir(out_dir: Path) -> Iterator[Path]:
    """Write a whole output folder into a fresh sibling, then swap it in.

    Yields a new empty folder next to `out_dir` (same file system, so the
    swap is renames). On a normal exit `out_dir` is renamed aside, the new
    folder renamed to `out_dir`, and the old one removed: a reader sees the
    old complete folder or the new complete one, never a mix. On any
    exception (Ctrl-C included) the new folder is removed and `out_dir`,
    if any, is left as it was; parents this call made are removed again.
    A kill between the two renames leaves `out_dir` absent, never partial.

    Raises:
        ValueError: from `check_out_dir`.
        OSError: the folder cannot be made or renamed.
    """
    out_dir = check_out_dir(out_dir)
    made = [p for p in (out_dir.parent, *out_dir.parent.parents) if not p.exists()]
    _remove_stale_staging(out_dir)
    new = out_dir.parent / f".{out_dir.name}{STAGING_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        new.mkdir(parents=True)
        yield new
        _swap_in(new, out_dir)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        for parent in made:  # nearest first: each is empty once its child is gone
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def _swap_in(new: Path, out_dir: Path) -> None:
    """Rename `new` to `out_dir`, the previous `out_dir` aside first."""
    if not out_dir.exists():
        new.rename(out_dir)
        return
    old = new.with_name(new.name + "-old")
    out_dir.rename(old)
    new.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_staging(out_dir: Path) -> None:
    """Remove the staging folders a killed earlier run of `out_dir` left
    (only those of processes that no longer exist)."""
    prefix = f".{out_dir.name}{STAGING_MARK}"
    if not out_dir.parent.is_dir():
        return
    for path in out_dir.parent.glob(prefix + "*"):
        pid = path.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True
