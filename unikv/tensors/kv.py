"""Per-layer K / V (or MLA latent) tensors over a pool's one byte buffer.

A token band's slot holds one token's KV for every layer of the band; a
page is `page_size` slots and its bytes are layer-major (DESIGN.md, "Byte
layout"): `[L0_K x ps | L0_V x ps | L1_K x ps | ...]` over the band's
layers in ascending layer index, each block `[ps, Hkv, D]` contiguous. Every
band's page grid starts at byte 0 with stride `entry_bytes * page_size`, so
layer l's K of the band's physical page p is a strided view of the buffer,
built once: compaction moves bytes and rewrites page tables, never the
views. The kernel-facing id of `pool.translate(kernel=True)` addresses the
same bytes: on rows of `entry_bytes // blocks_per_page` bytes, token t's K
of the band's i-th layer is row `kid + 2 i ps`, its V row `kid + (2 i + 1) ps`
(when K and V have equal sizes, which that row grid needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from unikv.kernels.translate.reference import translate as translate_tokens
from unikv.kernels.translate.reference import translate_pages

KINDS = ("kv", "latent")


@dataclass(frozen=True)
class LayerKV:
    """Where one attention layer keeps its per-token cache.

    Args:
        layer: the model's layer index (`module.layer_idx`).
        band: the pool's token band that holds it ("full", "swa").
        num_kv_heads: KV heads (1 for an MLA latent).
        head_dim_k: elements per head of a key (the latent's width for MLA).
        head_dim_v: elements per head of a value (0 for an MLA latent).
        dtype: the element type stored.
        kind: "kv" (separate K and V) or "latent" (MLA: one tensor per token).
    Raises:
        ValueError: naming the field, its value and what was expected.
    """

    layer: int
    band: str
    num_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    dtype: torch.dtype
    kind: str = "kv"

    def __post_init__(self) -> None:
        owner = f"LayerKV(layer={self.layer!r})"
        for name in ("layer", "num_kv_heads", "head_dim_k", "head_dim_v"):
            value = getattr(self, name)
            low = 0 if name in ("layer", "head_dim_v") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{owner}: {name}={value!r} must be an integer >= {low}")
        if not isinstance(self.band, str) or not self.band:
            raise ValueError(f"{owner}: band={self.band!r} must be a non-empty band name")
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"{owner}: dtype={self.dtype!r} must be a torch.dtype")
        if self.kind not in KINDS:
            raise ValueError(f"{owner}: kind={self.kind!r} must be one of {KINDS}")
        if self.kind == "latent" and (self.head_dim_v != 0 or self.num_kv_heads != 1):
            raise ValueError(f"{owner}: a latent layer has num_kv_heads=1 and head_dim_v=0; got "
                             f"num_kv_heads={self.num_kv_heads}, head_dim_v={self.head_dim_v}")
        if self.kind == "kv" and self.head_dim_v < 1:
            raise ValueError(f"{owner}: head_dim_v={self.head_dim_v} must be >= 1 for kind='kv'")

    @property
    def blocks(self) -> int:
        """Blocks this layer takes in a page: 2 (K, V) or 1 (latent)."""
        return 2 if self.kind == "kv" else 1

    @property
    def k_bytes(self) -> int:
        """Bytes of one token's key (or latent)."""
        return self.num_kv_heads * self.head_dim_k * self.dtype.itemsize

    @property
    def v_bytes(self) -> int:
        """Bytes of one token's value (0 for a latent)."""
        return self.num_kv_heads * self.head_dim_v * self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        """Bytes of one token of this layer (K + V, or the latent)."""
        return self.k_bytes + self.v_bytes


class KVViews:
    """Per-layer tensors over a materialised pool's buffer (built once).

    Args:
        pool: a `UnifiedPool` / `StaticPartitionPool` with real bytes
            (`SimBackend(materialize=True)`: its numpy buffer is wrapped by
            `torch.from_numpy`, no copy; `CudaBackend`: its device tensor).
        layers: one `LayerKV` per attention layer; each named band must be a
            token band of the pool.
    Raises:
        ValueError: an unmaterialised pool, a duplicate layer, an unknown or
            state band, a band whose layers' bytes per token differ from its
            `entry_bytes`, or whose `blocks_per_page` differs from the layers'
            blocks (2 per K/V layer, 1 per latent layer); each names the band
            and both figures.
    """

    def __init__(self, pool, layers: Sequence[LayerKV]) -> None:
        self.layers = {spec.layer: spec for spec in _checked_layers(layers)}
        self.page_size = pool.page_size
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        self._pool = pool
        self.bands = sorted({spec.band for spec in self.layers.values()})
        self.device = torch.device("cpu")
        for band in self.bands:
            members = sorted((s for s in self.layers.values() if s.band == band), key=lambda s: s.layer)
            pages = _band_pages(pool, band)
            _check_band(pool, band, members)
            self.device = pages.device
            self._build_band(pages, members)
        # the pool's device v2p per band: the same tensors for the pool's life (a numpy arena is wrapped)
        self._v2p = {band: _as_tensor(pool.page_table(band), None) for band in self.bands}

    def _build_band(self, pages: torch.Tensor, members: list[LayerKV]) -> None:
        """Views of each member layer over the band's `[P, page_bytes]` grid."""
        ps, offset = self.page_size, 0
        for spec in members:
            self._k[spec.layer] = _block(pages, offset, ps, spec, spec.head_dim_k)
            offset += ps * spec.k_bytes
            if spec.kind == "kv":
                self._v[spec.layer] = _block(pages, offset, ps, spec, spec.head_dim_v)
                offset += ps * spec.v_bytes

    def _spec(self, layer: int, want: str | None = None) -> LayerKV:
        spec = self.layers.get(layer)
        if spec is None:
            raise ValueError(f"layer={layer!r} is not one of the views' layers {sorted(self.layers)}")
        if want is not None and spec.kind != want:
            accessor = "latent" if spec.kind == "latent" else "k / v"
            raise ValueError(f"layer={layer}: kind={spec.kind!r}, expected {want!r}; use views.{accessor}()")
        return spec

    def band(self, layer: int) -> str:
        """The token band that holds `layer`."""
        return self._spec(layer).band

    def k(self, layer: int) -> torch.Tensor:
        """`[P, ps, Hkv, Dk]`: `layer`'s keys on its band's physical pages."""
        self._spec(layer, "kv")
        return self._k[layer]

    def v(self, layer: int) -> torch.Tensor:
        """`[P, ps, Hkv, Dv]`: `layer`'s values on its band's physical pages."""
        self._spec(layer, "kv")
        return self._v[layer]

    def latent(self, layer: int) -> torch.Tensor:
        """`[P, ps, 1, D]`: an MLA layer's latent on its band's physical pages."""
        self._spec(layer, "latent")
        return self._k[layer]

    def block_table(self, requests_pages: Sequence[Sequence[int]], band: str,
                    width: int | None = None) -> torch.Tensor:
        """`[B, W]` int32 physical page ids on `band`, on the views' device.

        Args:
            requests_pages: per request, its virtual page ids in position
                order (page j holds positions `j*ps .. j*ps+ps-1`).
            band: one of the views' bands.
            width: W (>= the longest request); default the longest request.
        Returns:
            The band's physical page of each virtual page; tombstoned or
            unbound pages and the padding past a request's last page -> 0
            (the sink). One host-to-device upload (the pool translates on
            its host tables, the truth).
        Raises:
            ValueError: an unknown band, a width below the longest request,
                or a page id outside the pool's virtual id space (the pool
                names it).
        """
        if band not in self.bands:
            raise ValueError(f"band={band!r} is not one of the views' bands {self.bands}")
        lens = np.fromiter(map(len, requests_pages), dtype=np.int64, count=len(requests_pages))
        longest = int(lens.max(initial=0))
        w = max(longest, 1) if width is None else width
        if isinstance(w, bool) or not isinstance(w, int) or w < max(longest, 1):
            raise ValueError(f"block_table: width={width!r} must be an integer >= {max(longest, 1)} "
                             "(the longest request's pages)")
        table = np.zeros((len(lens), w), dtype=np.int64)  # virtual page 0 maps to the sink
        if longest:
            table[np.arange(w) < lens[:, None]] = np.concatenate(requests_pages, dtype=np.int64)
        slots = self._pool.translate(table.reshape(-1) * self.page_size, band)
        if isinstance(slots, np.ndarray) or slots.device.type == "cpu":  # host memory: divide there
            pages = torch.from_numpy(np.asarray(slots) // self.page_size).to(torch.int32)
            return pages.to(self.device).reshape(len(lens), w)
        return (slots // self.page_size).to(torch.int32).reshape(len(lens), w)

    def page_tables(self) -> dict[str, torch.Tensor]:
        """Band -> the pool's device `v2p` table (int64, indexed by virtual
        page), committed first. The tensors are the same objects every call
        (the pool's device arena), so a captured CUDA graph may read them:
        a replay sees the tables as the last commit left them."""
        self._pool.commit()
        return self._v2p

    def translate_pages(self, v_pages: torch.Tensor, band: str) -> torch.Tensor:
        """Virtual page ids -> the band's physical pages, on the device.

        The fast twin of `block_table`: one gather from the pool's device
        `v2p` (no host translate, no device read). Tombstoned or unbound
        pages (-1 in `v2p`) and page 0 (the padding) give 0, the sink.
        Commit the tables first (`page_tables()`); inside a captured graph
        the gather reads them at replay time.

        Args:
            v_pages: int64 (or int32) virtual page ids of any shape
                (`PageRows.gather`: `[B, W]`), on the views' device.
            band: one of the views' bands.
        Returns:
            int32 physical pages, `v_pages`' shape.
        """
        v2p = self._v2p.get(band)
        if v2p is None:
            raise ValueError(f"band={band!r} is not one of the views' bands {self.bands}")
        return translate_pages(v_pages, v2p).to(torch.int32)

    def translate_slots(self, v_tokens: torch.Tensor, band: str) -> torch.Tensor:
        """Virtual token ids -> the band's physical slots (`pool.translate`'s
        values), by one gather from the device `v2p`; tombstones -> 0.

        Args:
            v_tokens: `[T]` int64 virtual token ids on the views' device.
        Returns:
            `[T]` int64 physical slot ids.
        """
        v2p = self._v2p.get(band)
        if v2p is None:
            raise ValueError(f"band={band!r} is not one of the views' bands {self.bands}")
        return translate_tokens(v_tokens, v2p, self.page_size)

    def write(self, layer: int, slots, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Store N tokens' K / V of `layer` at physical `slots` of its band.

        Args:
            slots: `[N]` physical slot ids on the layer's band
                (`pool.translate(vids, band)`), host or device.
            k: `[N, Hkv, Dk]` (a latent layer: `[N, 1, D]`), any float dtype
                (cast to the layer's).
            v: `[N, Hkv, Dv]`; None for a latent layer.
        Raises:
            ValueError: an unknown layer, shapes that differ from the
                layer's, or host slot ids outside the band's grid.
        """
        spec = self._spec(layer)
        s = _as_tensor(slots, self.device).reshape(-1).to(torch.int64)
        n, kv = s.numel(), self._k[layer]
        _check_rows("k", k, (n, spec.num_kv_heads, spec.head_dim_k), layer)
        if spec.kind == "kv":
            if v is None:
                raise ValueError(f"write: layer={layer} is a K/V layer; v=None, expected [N, Hkv, Dv]")
            _check_rows("v", v, (n, spec.num_kv_heads, spec.head_dim_v), layer)
        elif v is not None:
            raise ValueError(f"write: layer={layer} is a latent layer; v must be None")
        grid = kv.shape[0] * self.page_size
        if s.device.type == "cpu" and n and (int(s.min()) < 0 or int(s.max()) >= grid):
            raise ValueError(f"write: slots range over [{int(s.min())}, {int(s.max())}]; "
                             f"expected ids in [0, {grid}) on band {spec.band!r}")
        page, off = s // self.page_size, s % self.page_size
        kv[page, off] = k.to(device=self.device, dtype=spec.dtype)
        if v is not None:
            self._v[layer][page, off] = v.to(device=self.device, dtype=spec.dtype)


def _checked_layers(layers: Sequence[LayerKV]) -> list[LayerKV]:
    out = list(layers)
    if not out:
        raise ValueError("KVViews: layers=[] must name at least one LayerKV")
    for spec in out:
        if not isinstance(spec, LayerKV):
            raise ValueError(f"KVViews: layers holds {spec!r}; expected LayerKV objects")
    seen = [s.layer for s in out]
    dupes = sorted({i for i in seen if seen.count(i) > 1})
    if dupes:
        raise ValueError(f"KVViews: layers {dupes} are listed more than once")
    return out


def _band_pages(pool, band: str) -> torch.Tensor:
    """The band's `[P, page_bytes]` uint8 page grid over the pool's buffer."""
    names = [b.name for b in pool.layout.token_bands]
    if band not in names:
        raise ValueError(f"KVViews: band={band!r} is not a token band of the pool; token bands are {names}")
    if getattr(pool, "buffer", None) is None:
        raise ValueError(f"KVViews: the pool's backend {pool.backend!r} keeps no bytes; expected a "
                         "materialised pool (SimBackend(materialize=True) or CudaBackend)")
    rows = _as_tensor(pool.buffer_view(band), None)  # [max_slots, entry_bytes], no copy
    geom = pool.layout.geometry(band)
    return rows[: geom.num_pages * pool.page_size].reshape(geom.num_pages, geom.page_bytes)


def _check_band(pool, band: str, members: list[LayerKV]) -> None:
    spec = pool.layout.geometry(band).band
    total = sum(s.token_bytes for s in members)
    if total != spec.entry_bytes:
        raise ValueError(f"KVViews: band {band!r}: its layers {[s.layer for s in members]} hold "
                         f"{total} bytes per token; the band's entry_bytes is {spec.entry_bytes}")
    blocks = sum(s.blocks for s in members)
    if blocks != spec.blocks_per_page:
        raise ValueError(f"KVViews: band {band!r}: its layers make {blocks} blocks per page "
                         f"(2 per K/V layer, 1 per latent); the band's blocks_per_page is "
                         f"{spec.blocks_per_page}")
    for s in members:
        if spec.page_bytes % s.dtype.itemsize:
            raise ValueError(f"KVViews: band {band!r}: page bytes {spec.page_bytes} are not a multiple "
                             f"of layer {s.layer}'s {s.dtype} element size {s.dtype.itemsize}")


def _check_rows(name: str, x, shape: tuple[int, int, int], layer: int) -> None:
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or not x.dtype.is_floating_point:
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"write: layer={layer}: {name} is {got}; expected a float tensor of shape {list(shape)}")


def _block(pages: torch.Tensor, offset: int, ps: int, spec: LayerKV, head_dim: int) -> torch.Tensor:
    """`[P, ps, H, D]` of `spec.dtype` over bytes `[offset, offset + ps*H*D*es)` of every page."""
    size = ps * spec.num_kv_heads * head_dim * spec.dtype.itemsize
    if offset % spec.dtype.itemsize:
        raise ValueError(f"KVViews: band {spec.band!r}: layer {spec.layer}'s block starts at byte "
                         f"{offset} of a page, not aligned to its {spec.dtype} element size")
    typed = pages[:, offset: offset + size].view(spec.dtype)
    return typed.view(pages.shape[0], ps, spec.num_kv_heads, head_dim)


def _as_tensor(x, device: torch.device | None) -> torch.Tensor:
    """A numpy array or tensor as a tensor (numpy: zero-copy), on `device` if given."""
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    return t if device is None else t.to(device)
