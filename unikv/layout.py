"""Layout geometry: band specs, the chain order, the sink and page math.

A `Layout` is data: a buffer size and a tuple of `Band` specs listed from the
lowest byte to the highest. Every band views the whole buffer with its own
stride (`entry_bytes`), so physical page `p` of band `b` covers bytes
`[p * page_bytes_b, (p + 1) * page_bytes_b)`. Only the allocators keep the
bands apart.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TypeVar


class Grow(enum.Enum):
    """Where a band's occupied range grows from."""

    UP = "up"  # from the low end of the buffer, toward higher bytes
    DOWN = "down"  # from the high end, toward lower bytes
    FLOAT = "float"  # a movable span between two neighbours


class Unit(enum.Enum):
    """What one slot of a band holds."""

    TOKEN = "token"  # one token's KV for all layers of the band
    REQUEST = "request"  # one request's recurrent state (mamba / conv)


class Side(enum.Enum):
    """A side of a band's occupied range."""

    LOW = "low"
    HIGH = "high"

    @property
    def other(self) -> Side:
        return Side.HIGH if self is Side.LOW else Side.LOW


E = TypeVar("E", bound=enum.Enum)

# The grow chains the bands support, low byte -> high byte. An END band
# grows from its own buffer end (one up band, first; one down band, last)
# and a float needs a neighbour on both sides; other chains build pools in
# which some band can never allocate (`up | up | down`, `up | down | down`).
SUPPORTED_CHAINS: tuple[tuple[Grow, ...], ...] = (
    (Grow.UP,), (Grow.DOWN,), (Grow.UP, Grow.DOWN), (Grow.UP, Grow.FLOAT, Grow.DOWN))


def supported_chains() -> str:
    """`SUPPORTED_CHAINS` as text: "up, down, up|down, up|float|down"."""
    return ", ".join("|".join(g.value for g in chain) for chain in SUPPORTED_CHAINS)


def _coerce(enum_cls: type[E], value: E | str, field_name: str) -> E:
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"{field_name}={value!r} is not one of {valid}") from None


def _positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name}={value!r} must be a positive integer")


@dataclass(frozen=True, init=False)
class Band:
    """One sub-pool of the buffer.

    The constructor takes `grow` and `unit` as strings or enums; the fields
    always hold the enums (so `__init__` is written out: the generated one
    would declare the fields' types for the arguments).

    Args:
        name: unique name, e.g. "full", "swa", "mamba".
        entry_bytes: bytes of one slot (one token's KV over all layers of the
            band, or one request's state).
        grow: "up", "down" or "float" (or a `Grow`).
        page_size: slots per page; token bands of one layout share it;
            request bands use 1.
        unit: "token" or "request" (or a `Unit`).
        blocks_per_page: kernel-facing page multiplier (2 x layers for K/V
            attention stored layer-major inside a page); 1 if unused.
    """

    name: str
    _: KW_ONLY
    entry_bytes: int
    grow: Grow
    page_size: int
    unit: Unit
    blocks_per_page: int

    def __init__(self, name: str, *, entry_bytes: int, grow: Grow | str = Grow.DOWN, page_size: int = 1,
                 unit: Unit | str = Unit.TOKEN, blocks_per_page: int = 1) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"Band: name={name!r} must be a non-empty string")
        owner = f"Band {name!r}"
        _positive_int(owner, "entry_bytes", entry_bytes)
        _positive_int(owner, "page_size", page_size)
        _positive_int(owner, "blocks_per_page", blocks_per_page)
        set_field = object.__setattr__  # the dataclass is frozen
        set_field(self, "name", name)
        set_field(self, "entry_bytes", entry_bytes)
        set_field(self, "grow", _coerce(Grow, grow, f"{owner}: grow"))
        set_field(self, "page_size", page_size)
        set_field(self, "unit", _coerce(Unit, unit, f"{owner}: unit"))
        set_field(self, "blocks_per_page", blocks_per_page)
        if self.unit is Unit.REQUEST and self.page_size != 1:
            raise ValueError(
                f"{owner}: page_size={self.page_size} but a request band holds "
                "one state per slot; expected page_size=1"
            )

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (`entry_bytes * page_size`)."""
        return self.entry_bytes * self.page_size


@dataclass(frozen=True)
class BandGeometry:
    """Derived page geometry of one band inside a layout.

    Attributes:
        index: position in the chain (0 = lowest bytes).
        max_slots: `total_bytes // entry_bytes` (the band's slot grid).
        num_pages: pages of the grid that fit in the buffer.
        min_page: first page past the sink; pages below it lie in the sink.
        page_bytes: bytes per page.
    """

    band: Band
    index: int
    max_slots: int
    num_pages: int
    min_page: int
    page_bytes: int

    @property
    def usable_pages(self) -> int:
        return self.num_pages - self.min_page


@dataclass(frozen=True, kw_only=True, init=False)
class Layout:
    """A buffer of `total_bytes` and its bands, listed low byte -> high byte.

    `bands` may be any sequence of `Band`; the field holds it as a tuple.

    Supported chains (`SUPPORTED_CHAINS`): one band (up or down); `up |
    down`; `up | float | down`; each band of either unit.

    Raises:
        ValueError: naming the field and the expected value, for a
            non-positive size, duplicate names, a chain of grow directions
            outside `SUPPORTED_CHAINS` (the message lists them), token bands
            with different page sizes, or a buffer too small for the sink
            plus one page per band.
    """

    total_bytes: int
    bands: tuple[Band, ...]

    def __init__(self, *, total_bytes: int, bands: Sequence[Band] = ()) -> None:
        _positive_int("Layout", "total_bytes", total_bytes)
        bands = tuple(bands)
        object.__setattr__(self, "total_bytes", total_bytes)  # the dataclass is frozen
        object.__setattr__(self, "bands", bands)
        if not bands:
            raise ValueError("Layout: bands=() must hold at least one Band")
        for b in bands:
            if not isinstance(b, Band):
                raise ValueError(f"Layout: bands holds {b!r}; expected Band objects")
        names = [b.name for b in bands]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"Layout: duplicate band names {dupes}")
        self._check_chain(bands)
        page_sizes = {b.page_size for b in bands if b.unit is Unit.TOKEN}
        if len(page_sizes) > 1:
            raise ValueError(
                f"Layout: token bands have page sizes {sorted(page_sizes)}; "
                "coupled token bands must share one page_size"
            )
        object.__setattr__(self, "_geoms", self._build_geometry(bands))

    @staticmethod
    def _check_chain(bands: Sequence[Band]) -> None:
        grows = tuple(b.grow for b in bands)
        if grows not in SUPPORTED_CHAINS:
            names = " | ".join(f"{b.name}({b.grow.value})" for b in bands)
            raise ValueError(f"Layout: bands={names} (low byte -> high byte) is not a supported "
                             f"chain; supported chains are {supported_chains()}, with any units")

    @property
    def sink_bytes(self) -> int:
        """Reserved lowest bytes: max(entry bytes, token-band page bytes)."""
        entry_max = max(b.entry_bytes for b in self.bands)
        token_pages = [b.page_bytes for b in self.bands if b.unit is Unit.TOKEN]
        return max([entry_max] + token_pages)

    def _build_geometry(self, bands: Sequence[Band]) -> dict[str, BandGeometry]:
        sink = max(
            [b.entry_bytes for b in bands]
            + [b.page_bytes for b in bands if b.unit is Unit.TOKEN]
        )
        geoms: dict[str, BandGeometry] = {}
        for i, b in enumerate(bands):
            max_slots = self.total_bytes // b.entry_bytes
            first_slot = -(-sink // b.entry_bytes)
            min_page = -(-first_slot // b.page_size)
            num_pages = max_slots // b.page_size
            if num_pages - min_page < 1:
                raise ValueError(
                    f"Layout: total_bytes={self.total_bytes} leaves band {b.name!r} "
                    f"no page past the {sink}-byte sink (page_bytes={b.page_bytes})"
                )
            geoms[b.name] = BandGeometry(b, i, max_slots, num_pages, min_page, b.page_bytes)
        need = sink + sum(b.page_bytes for b in bands)
        if need > self.total_bytes:
            raise ValueError(
                f"Layout: total_bytes={self.total_bytes} is too small for the "
                f"{sink}-byte sink plus one page of every band (needs >= {need})"
            )
        return geoms

    def geometry(self, name: str) -> BandGeometry:
        """Geometry of band `name`. Raises KeyError naming the valid bands."""
        try:
            return self._geoms[name]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"unknown band {name!r}; bands are {self.names}") from None

    def __iter__(self) -> Iterator[BandGeometry]:
        return iter(self._geoms.values())  # type: ignore[attr-defined]

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.bands]

    @property
    def token_bands(self) -> list[Band]:
        return [b for b in self.bands if b.unit is Unit.TOKEN]

    @property
    def state_bands(self) -> list[Band]:
        return [b for b in self.bands if b.unit is Unit.REQUEST]

    @property
    def page_size(self) -> int:
        """The token bands' shared page size (1 if there is no token band)."""
        tokens = self.token_bands
        return tokens[0].page_size if tokens else 1
