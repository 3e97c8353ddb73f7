"""Per-layer recurrent-state tensors over a pool's state band: `StateViews`.

A state band (a `request` band) holds one request's state for all of its
layers in one slot of `entry_bytes`. Inside a slot the bytes are
layer-major (the band's layers in ascending layer index), then each layer's
named tensors in the order given, each at an offset aligned to its element
size. Every band's slot grid starts at byte 0 of the buffer (DESIGN.md,
"Byte layout"), so `get(layer, name)[s]` is physical slot `s` (what
`pool.translate(state_ids, band)` returns) and the views never change:
compaction moves slot bytes and rewrites page tables only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unikv.layout import Unit

if TYPE_CHECKING:
    import torch

TensorSpec = tuple[str, tuple[int, ...], Any]  # (name, shape, torch dtype)


@dataclass(frozen=True)
class LayerState:
    """The state one layer keeps per request, in one state band.

    Args:
        layer: the model's layer index (>= 0).
        band: the state band holding it (a `request` band of the pool).
        tensors: `(name, shape, dtype)` per tensor, in slot order; e.g.
            `(("conv", (conv_dim, d_conv - 1), torch.bfloat16),
            ("ssm", (heads, head_dim, d_state), torch.float32))`.
    Raises:
        ValueError: a bad field, named with its value.
    """

    layer: int
    band: str
    tensors: tuple[TensorSpec, ...]

    def __post_init__(self) -> None:
        import torch

        owner = f"LayerState(layer={self.layer!r})"
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"{owner}: layer={self.layer!r} must be an integer >= 0")
        if not isinstance(self.band, str) or not self.band:
            raise ValueError(f"{owner}: band={self.band!r} must be a non-empty string")
        if not isinstance(self.tensors, tuple) or not self.tensors:
            raise ValueError(f"{owner}: tensors={self.tensors!r} must be a non-empty tuple of "
                             "(name, shape, dtype)")
        names = [t[0] if isinstance(t, tuple) and t else None for t in self.tensors]
        for spec in self.tensors:
            _check_tensor(owner, spec, torch)
        if len(set(names)) != len(names):
            raise ValueError(f"{owner}: tensors names {names} repeat a name")


def _check_tensor(owner: str, spec, torch) -> None:
    if not isinstance(spec, tuple) or len(spec) != 3:
        raise ValueError(f"{owner}: tensors entry {spec!r} must be (name, shape, dtype)")
    name, shape, dtype = spec
    if not isinstance(name, str) or not name:
        raise ValueError(f"{owner}: tensor name={name!r} must be a non-empty string")
    if (not isinstance(shape, tuple)
            or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape)):
        raise ValueError(f"{owner}: tensor {name!r} shape={shape!r} must be a tuple of positive ints")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{owner}: tensor {name!r} dtype={dtype!r} must be a torch.dtype")


@dataclass(frozen=True)
class _Placed:
    """One tensor of one layer inside a slot: byte offset and size."""

    band: str
    offset_bytes: int
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int


class StateViews:
    """Per-layer state tensors over a pool's materialised buffer, row = slot.

    Args:
        pool: a `UnifiedPool` (or `StaticPartitionPool`) whose buffer is
            materialised: `SimBackend(materialize=True)` (a numpy uint8
            array, viewed zero-copy through `torch.from_numpy`) or
            `CudaBackend` (a torch uint8 tensor).
        layers: the `LayerState` of every recurrent layer; per band their
            bytes (with alignment padding) must add up to the band's
            `entry_bytes`.
    Raises:
        ValueError: the buffer is not materialised, a band is unknown or a
            token band, a layer repeats, a band's layers do not add up to its
            `entry_bytes`, or a tensor's element size does not divide the
            slot stride (its rows would be misaligned); each names the band
            or layer.
    """

    def __init__(self, pool, layers: Sequence[LayerState]) -> None:
        buf = _torch_buffer(pool)
        specs = _check_layers(pool, layers)
        self._band_of = {s.layer: s.band for s in specs}
        self._placed: dict[tuple[int, str], _Placed] = {}
        for band in sorted({s.band for s in specs}):
            entry = pool.layout.geometry(band).band.entry_bytes
            own = sorted((s for s in specs if s.band == band), key=lambda s: s.layer)
            self._placed.update(_place_band(band, own, entry))
        self._views = {key: _strided(buf, p, pool.layout.geometry(p.band))
                       for key, p in self._placed.items()}
        self.layers = tuple(sorted(self._band_of))

    def get(self, layer: int, name: str) -> torch.Tensor:
        """Layer `layer`'s tensor `name` as `[max_slots, *shape]`; row `s` is
        physical slot `s` of the layer's band.

        Raises:
            ValueError: an unknown layer or tensor name.
        """
        view = self._views.get((layer, name))
        if view is None:
            self.band(layer)  # names an unknown layer
            names = [n for (lyr, n) in self._views if lyr == layer]
            raise ValueError(f"StateViews.get: layer {layer} has no tensor {name!r}; it has {names}")
        return view

    def band(self, layer: int) -> str:
        """The state band holding layer `layer`. ValueError for an unknown layer."""
        if layer not in self._band_of:
            raise ValueError(f"StateViews: layer={layer!r} has no state; layers are {list(self.layers)}")
        return self._band_of[layer]

    def offset_bytes(self, layer: int, name: str) -> int:
        """Byte offset of tensor `name` of `layer` inside a slot."""
        self.get(layer, name)
        return self._placed[(layer, name)].offset_bytes


def _torch_buffer(pool) -> torch.Tensor:
    import numpy as np
    import torch

    buf = getattr(pool, "buffer", None)
    if buf is None:
        raise ValueError("StateViews: pool.buffer=None: the pool's buffer is not materialised "
                         "(use SimBackend(materialize=True) or CudaBackend)")
    if isinstance(buf, np.ndarray):
        buf = torch.from_numpy(buf)
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"StateViews: pool.buffer dtype={buf.dtype}, dim={buf.dim()}; expected a 1-D uint8 buffer")
    return buf


def _check_layers(pool, layers: Sequence[LayerState]) -> list[LayerState]:
    specs = list(layers)
    if not specs:
        raise ValueError("StateViews: layers=[] must name at least one LayerState")
    seen: set[int] = set()
    for s in specs:
        if not isinstance(s, LayerState):
            raise ValueError(f"StateViews: layers entry {s!r} must be a LayerState")
        if s.band not in pool.layout.names:
            raise ValueError(f"StateViews: layer {s.layer}: unknown band {s.band!r}; "
                             f"bands are {pool.layout.names}")
        if pool.layout.geometry(s.band).band.unit is not Unit.REQUEST:
            raise ValueError(f"StateViews: layer {s.layer}: band {s.band!r} is a token band; "
                             "state needs a request band")
        if s.layer in seen:
            raise ValueError(f"StateViews: layer {s.layer} is listed twice")
        seen.add(s.layer)
    return specs


def _place_band(band: str, layers: list[LayerState], entry_bytes: int) -> dict[tuple[int, str], _Placed]:
    """Byte offsets of every tensor of `layers` (ascending layer order) in a
    slot of `band`; refuses a total other than `entry_bytes` and element
    sizes that do not divide the slot stride."""
    out = {}
    cursor = 0
    for s in layers:
        for name, shape, dtype in s.tensors:
            elem = dtype.itemsize
            if entry_bytes % elem:
                raise ValueError(f"StateViews: band {band!r}: layer {s.layer} tensor {name!r} "
                                 f"({dtype}, {elem} bytes) is misaligned: entry_bytes={entry_bytes} "
                                 f"is not a multiple of {elem}")
            cursor = -(-cursor // elem) * elem
            nbytes = elem * _numel(shape)
            out[(s.layer, name)] = _Placed(band, cursor, shape, dtype, nbytes)
            cursor += nbytes
    if cursor != entry_bytes:
        raise ValueError(f"StateViews: band {band!r}: its layers' tensors take {cursor} bytes per slot "
                         f"(alignment included); expected the band's entry_bytes={entry_bytes}")
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _strided(buf: torch.Tensor, p: _Placed, geom) -> torch.Tensor:
    """`[max_slots, *shape]` view of `buf`: row stride the band's entry bytes."""
    elem = p.dtype.itemsize
    typed = buf[: buf.numel() // elem * elem].view(p.dtype)
    inner = [1] * len(p.shape)
    for i in range(len(p.shape) - 2, -1, -1):
        inner[i] = inner[i + 1] * p.shape[i + 1]
    stride = (geom.band.entry_bytes // elem, *inner)
    return typed.as_strided((geom.max_slots, *p.shape), stride, p.offset_bytes // elem)
