"""The in-flight forward, as page moves and page reuse must respect it.

A forward launched before a move reads and writes the physical pages its ids
translated to at launch. So a page the forward WRITES must not be moved
before it finishes (the copy would miss the write), and a page a move
VACATED must not be handed out again before the forward stops reading it.
One done-event covers both hazards: it is recorded after the whole forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Generic, overload

import numpy as np

if TYPE_CHECKING:
    # The default (PEP 696) is for the checker: `typing.TypeVar` takes it
    # only from Python 3.13, and at run time a TypeVar's default is unused.
    from typing_extensions import TypeVar

    from unikv.backends.base import Backend

    V = TypeVar("V", default=Any)
else:
    from typing import TypeVar

    V = TypeVar("V")


class Epoch:
    """A chain-wide mutation counter; capacity memos are keyed on it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class Tracked(Generic[V]):
    """A capacity-bearing attribute: every assignment bumps `obj.epoch`.

    Values must be rebound, never mutated in place, so no mutation can slip
    past the memo invalidation. Only assignment goes through the
    descriptor: it defines no `__get__`, so reads find the value in the
    instance dict under the same name, at plain attribute speed (the
    allocator reads these far more often than it writes them). `V` is the
    value's type (declare `live: Tracked[int] = Tracked()`); the checker
    is told reads return it.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __set__(self, obj: Any, value: V) -> None:
        obj.__dict__[self._name] = value
        obj.epoch.value += 1

    if TYPE_CHECKING:  # for the checker only: a real `__get__` would slow every read
        @overload
        def __get__(self, obj: None, owner: type) -> Tracked[V]: ...
        @overload
        def __get__(self, obj: object, owner: type) -> V: ...
        def __get__(self, obj: object, owner: type) -> Tracked[V] | V: ...


class Hazards:
    """The newest forward's done event and the virtual pages it writes."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.event: Any | None = None
        self._writes: dict[str, np.ndarray] = {}
        self._sets: dict[int, set[int]] = {}  # id(writes array) -> its set, built on first ask
        # band name -> [pages as Python ints, their set or None until asked]:
        # writes given as ints, kept as they came (the token bands of a
        # coupled write share one entry, so one set serves them all)
        self._ints: dict[str, list] = {}
        self.settles = 0

    def set_forward(self, event: Any, writes: dict[str, np.ndarray],
                    shared: tuple[Sequence[str], list[int]] | None = None,
                    ints: Mapping[str, list[int]] | None = None) -> None:
        """Record a launched forward; `writes` maps band name -> virtual
        pages. `shared`: (band names, virtual pages as Python ints) one
        write every band named makes (a coupled token write); `ints`: band
        name -> pages (or slots) as Python ints, one band each. Their
        arrays are built only when `writes` is read (the movers ask for
        sets)."""
        self.event = event
        self._writes = writes
        self._sets = {}
        found: dict[str, list] = {}
        if shared is not None:
            entry = [shared[1], None]
            for name in shared[0]:
                found[name] = entry
        if ints:
            for name, pages in ints.items():
                found[name] = [pages, None]
        self._ints = found

    @property
    def writes(self) -> dict[str, np.ndarray]:
        """Band name -> the virtual pages the forward writes (int64)."""
        if self._ints:
            arrays: dict[int, np.ndarray] = {}  # id(entry) -> its array: shared entries share one
            built = {}
            for name, entry in self._ints.items():
                arr = arrays.get(id(entry))
                if arr is None:
                    arr = arrays[id(entry)] = np.array(entry[0], dtype=np.int64)
                    if entry[1] is not None:
                        self._sets[id(arr)] = entry[1]
                built[name] = arr
            self._writes = {**built, **self._writes}
            self._ints = {}
        return self._writes

    def clear(self) -> None:
        self.event = None
        self._writes = {}
        self._sets = {}
        self._ints = {}

    def pending_event(self) -> Any | None:
        """The forward's event while it is still running, else None."""
        if self.event is not None and self.backend.event_done(self.event):
            self.clear()
        return self.event

    def settle(self) -> None:
        """Stream-wait the forward so both hazards are gone for later work."""
        if self.event is None:
            return
        self.backend.wait_event(self.event)
        self.settles += 1
        self.clear()

    def written(self, name: str) -> AbstractSet[int]:
        """Virtual pages of band `name` the running forward writes (empty
        once it is done). A mover tests the virtual page of each physical
        page it would move (`p2v`): while the forward runs none of its pages
        can have moved (every mover settles or stops at them first)."""
        if self.pending_event() is None:
            return _NONE
        return self.writes_of(name)

    def writes_page(self, name: str, page: int) -> bool:
        """Whether the forward (just seen running) writes virtual page `page`
        of band `name`: `page in writes_of(name)` for one page, without
        building the set of a write given as ints (a scan of its list is
        cheaper than the set for a single question)."""
        entry = self._ints.get(name)
        if entry is not None:
            return page in (entry[0] if entry[1] is None else entry[1])
        return page in self.writes_of(name)

    def writes_of(self, name: str) -> AbstractSet[int]:
        """`written(name)` for a caller that has just seen the forward
        running (`pending_event()` is not None)."""
        entry = self._ints.get(name)
        if entry is not None:
            if entry[1] is None:
                entry[1] = set(entry[0])
            return entry[1]
        pages = self._writes.get(name)
        if pages is None:
            return _NONE
        # Keyed by the array: the token bands share one (a coupled write).
        found = self._sets.get(id(pages))
        if found is None:
            found = self._sets[id(pages)] = set(pages.tolist())
        return found


_NONE: frozenset[int] = frozenset()
