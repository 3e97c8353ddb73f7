"""The engine's view of requests and forwards, as the driver keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    """The engine's view of one request.

    `tokens[i]` is the virtual id of position i; positions `[0, released)`
    (a multiple of page_size) are released on the window band; `states`
    maps a state band to the request's slot id there.
    """

    rid: int
    tokens: list[int]
    states: dict[str, int] = field(default_factory=dict)
    released: int = 0


@dataclass
class Forward:
    """A launched forward: its event, what it touches, reads and writes."""

    event: object
    fire_at: int  # driver op count at which the driver fires it
    touched: set  # (band, virtual page or state id) it reads or writes
    reads: list  # (band, virtual ids, launch-time physical slots, rows expected there)
    writes: list  # (band, virtual ids, launch-time physical slots, rows it writes)
