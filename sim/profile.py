"""Measured step times of one model on one GPU, and a step cost that interpolates them.

A profile (`sim/data/profiles/<model>__<gpu>.json`, format in
docs/cost_model.md, "Profiles") holds forward times measured by the real
executor over grids: prefill (chunk tokens x cached tokens), decode (batch
x context tokens), mixed steps (chunk tokens x batch, at one reference
context), and the non-forward time of a step. `ProfileStepCost` is called
as the roofline is (`sim.cost.EngineStepCost`):

    step = non_forward_s + forward(shape) + move

A step's forward is one packed forward (attention-only models), or, for a
model with recurrent state, one forward per prefill chunk and one for the
decoders, as the real executor runs it (`STEP_FORWARDS`).

Interpolation is bilinear in log space (log1p of each axis, log of the
time), so a power law between grid points is exact; along the prefill
grid's cached tokens it is linear in tokens and in time (a chunk's
attention over cached keys is affine in their count, and that axis starts
at 0, where log1p would give a 1,024-token context 91 % of the weight of
the 2,048-token column). A query outside a grid
is extrapolated along the edge cell's log-log slope and flagged: the step
cost counts such steps (`extrapolated_steps`, in the run's summary), it
never clamps silently and never refuses mid-replay.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

FORMAT = "unikv-step-profile"
VERSION = 1
PROVENANCE_FIELDS = ("gpu_name", "driver", "torch", "triton", "date", "command", "git_revision")
"""What every profile must say about how it was measured (more keys may follow)."""
GRIDS = {"prefill": ("chunk_tokens", "cached_tokens"), "decode": ("batch", "context_tokens"),
         "mixed": ("chunk_tokens", "batch")}
"""Each grid's (row axis, column axis); `forward_s[i][j]` is at (row[i], column[j])."""
STEP_FORWARDS = ("packed", "per_chunk")
"""How the measured executor runs a step (the profile's `step_forwards`;
absent: "packed"): "packed", one forward of every chunk and decoder
(attention-only models); "per_chunk", each prefill chunk its own forward,
then the decoders in one (models with recurrent state:
`sim.real.executor.state_plans`), so a step's further chunks add their
own forwards."""


@dataclass(frozen=True, kw_only=True)
class Grid:
    """Forward seconds over a 2-D grid, interpolated in log space.

    Attributes:
        rows / cols: strictly increasing non-negative axis points (>= 2 each).
        forward_s: seconds, `forward_s[i][j]` at (rows[i], cols[j]), all > 0.
        filled: cells that were not measured (the GPU could not hold their
            KV) but extrapolated from measured neighbours when the profile
            was written (`benchmarks/profile_model.py`); () when every cell
            was measured.
        linear_cols: between two columns, interpolate linearly in the
            column and the time (the rows stay log-log); beyond the column
            axis, extrapolate log-log as every axis does.
    """

    rows: tuple[float, ...]
    cols: tuple[float, ...]
    forward_s: tuple[tuple[float, ...], ...]
    filled: frozenset[tuple[int, int]] = frozenset()
    linear_cols: bool = False
    _log_t: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)
    _log_rows: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_cols: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _near_filled: frozenset[tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __call__(self, row: float, col: float) -> tuple[float, bool]:
        """(seconds at (row, col), whether the point lies outside the grid's
        measured cells: beyond its axes, or in a cell a filled corner bounds)."""
        return self.at_row(self.row_cell(row), col)

    def row_cell(self, row: float) -> tuple[int, float, bool]:
        """Where `row` lies on the row axis (`_cell`): what `at_row` takes,
        so that a caller asking one row often may keep it."""
        return _cell(self.rows, self._log_rows, row)

    def at_row(self, row_cell: tuple[int, float, bool], col: float) -> tuple[float, bool]:
        """`self(row, col)` with the row's `row_cell(row)` given."""
        i, u, out_r = row_cell
        j, v, out_c = _cell(self.cols, self._log_cols, col)
        t, t_next = self._log_t[i], self._log_t[i + 1]
        if self.linear_cols and not out_c:
            # log-log along the rows at the two columns, then linear between them
            v = (col - self.cols[j]) / (self.cols[j + 1] - self.cols[j])
            at_j = math.exp((1 - u) * t[j] + u * t_next[j])
            at_next = math.exp((1 - u) * t[j + 1] + u * t_next[j + 1])
            seconds = (1 - v) * at_j + v * at_next
        else:
            # the corners' weights: (1 - u)(1 - v), u(1 - v), (1 - u)v, uv
            seconds = math.exp((1 - u) * (1 - v) * t[j] + u * (1 - v) * t_next[j]
                               + (1 - u) * v * t[j + 1] + u * v * t_next[j + 1])
        outside = out_r or out_c
        if not outside and (i, j) in self._near_filled:  # a corner with weight reads a filled cell
            filled = self.filled
            w00, w10, w01, w11 = (1 - u) * (1 - v), u * (1 - v), (1 - u) * v, u * v
            outside = ((w00 > 0 and (i, j) in filled) or (w10 > 0 and (i + 1, j) in filled)
                       or (w01 > 0 and (i, j + 1) in filled) or (w11 > 0 and (i + 1, j + 1) in filled))
        return seconds, outside

    def __post_init__(self) -> None:
        # the log of every cell, once: each step's lookup reads four of them
        object.__setattr__(self, "_log_t", tuple(tuple(math.log(x) for x in r) for r in self.forward_s))
        # and of each axis point's log1p (every lookup reads two per axis)
        object.__setattr__(self, "_log_rows", tuple(math.log1p(x) for x in self.rows))
        object.__setattr__(self, "_log_cols", tuple(math.log1p(x) for x in self.cols))
        # the cells (i, j) with a filled corner: only there may a weight read one
        object.__setattr__(self, "_near_filled", frozenset(
            (i - a, j - b) for i, j in self.filled for a in (0, 1) for b in (0, 1)))


def _cell(axis: tuple[float, ...], log_axis: tuple[float, ...], x: float) -> tuple[int, float, bool]:
    """(index of the cell holding x, x's fraction across it in log1p space,
    outside): outside the axis, the edge cell and a fraction < 0 or > 1.
    `log_axis`: log1p of each point of `axis`."""
    k = bisect.bisect_right(axis, x) - 1  # clamped to the edge cells (no min/max calls: every step)
    if k < 0:
        k = 0
    elif k > len(axis) - 2:
        k = len(axis) - 2
    lo, hi = log_axis[k], log_axis[k + 1]
    return k, (math.log1p(x) - lo) / (hi - lo), not axis[0] <= x <= axis[-1]


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    """One model's measured step times on one GPU (the profile file, validated).

    Attributes:
        model / gpu: what was measured (a bundled model name, a bundled GPU name).
        provenance: at least PROVENANCE_FIELDS, each a non-empty string.
        non_forward_s: seconds of a step outside its forward (scheduling,
            allocator, launches), measured from the real executor.
        prefill / decode / mixed: the grids (GRIDS names their axes).
        mixed_context_tokens: the decoders' context in the mixed grid (its
            chunks attend no cached tokens).
        moe_touch: (batch tokens, experts touched) pairs measured, or ().
        step_forwards: one of STEP_FORWARDS.
        packed_buckets: the token counts the measured executor padded a
            packed step up to (`--prefill-graphs`: `sim.real.packed_graphs.
            PACKED_BUCKETS`), or () where it ran every step at its own size.
            A step of T prefill and decode tokens, T <= the largest bucket,
            then costs what the grids measured at its bucket's size
            (`padded`): every prefill and mixed point was measured so.
            With step_forwards "per_chunk" each chunk's own forward is
            padded (its T is its own tokens); the decoders of a mixed step
            run apart, through the decode buckets.
        decode_buckets: the batch sizes the measured executor padded a
            decode step up to (`sim.real.graphs.BUCKETS`: its decode CUDA
            graphs), or () where it ran every decode step at its own batch.
        decode_padding_routes_as_one: with decode_buckets, the measured
            model's padding rows cost one more token's expert routing, not
            a row each (`padding_routes_as_one`; `decode_padding_s`).
        continuing_cached_tokens: with step_forwards "per_chunk", the
            prefill grid's first column after 0 (None: no such column
            declared). A model with recurrent state runs a chunk that
            continues its request on another path than a first chunk (its
            conv and SSM state read in, a graph of its own), at a cost that
            does not grow with the cached tokens: Nemotron-3-Nano's 8,192-
            token chunk takes 9.2 ms more over 256 cached tokens than over
            none, and 37.1 ms more over 8,192 (H200,
            results/real/h200/session_2026-12-03b/probe_2f773e3.log). Column
            0 is a first chunk; a continuing chunk over fewer cached tokens
            than this column is read at it, so the interpolation from 0
            never prices a continuing chunk as part first chunk.
        path: the file it was read from (None: built in memory).
    """

    model: str
    gpu: str
    provenance: Mapping[str, str]
    non_forward_s: float
    prefill: Grid
    decode: Grid
    mixed: Grid
    mixed_context_tokens: int
    moe_touch: tuple[tuple[int, float], ...] = ()
    step_forwards: str = "packed"
    packed_buckets: tuple[int, ...] = ()
    decode_buckets: tuple[int, ...] = ()
    decode_padding_routes_as_one: bool = False
    continuing_cached_tokens: int | None = None
    path: Path | None = None
    # with packed_buckets: the prefill grid over its rows' bucket sizes, and per mixed column
    # (batch b) the rows' bucket sizes less b with log1p of each (`_mixed_at`)
    _padded_prefill: Grid | None = field(default=None, init=False, repr=False, compare=False)
    _mixed_rows: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...] = field(
        default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        first = self.continuing_cached_tokens
        if first is not None:
            if self.step_forwards != "per_chunk":
                raise ValueError(f"continuing_cached_tokens={first!r} needs step_forwards 'per_chunk': a packed "
                                 "step's chunks run on one path")
            cols = self.prefill.cols
            if len(cols) < 3 or cols[0] != 0 or cols[1] != first:
                raise ValueError(f"continuing_cached_tokens={first!r} must be the prefill grid's second cached "
                                 f"column, after 0 and before another (cached_tokens={list(cols)})")
        if not self.packed_buckets:
            return
        pre = self.prefill
        rows = tuple(float(self.padded(r)) for r in pre.rows)
        if any(b <= a for a, b in zip(rows, rows[1:])):
            raise ValueError(f"prefill.chunk_tokens={list(pre.rows)}: two rows pad to one bucket of "
                             f"{list(self.packed_buckets)}, so the grid cannot tell them apart")
        object.__setattr__(self, "_padded_prefill", Grid(rows=rows, cols=pre.cols, forward_s=pre.forward_s,
                                                         filled=pre.filled, linear_cols=pre.linear_cols))
        mixed, per_col = self.mixed, []
        for b in mixed.cols:
            eff = tuple(float(self._mixed_chunk(r, b)) for r in mixed.rows)
            if any(y <= x for x, y in zip(eff, eff[1:])):
                raise ValueError(f"mixed.chunk_tokens={list(mixed.rows)} at batch {b:g}: two rows pad to one "
                                 f"bucket of {list(self.packed_buckets)}, so the grid cannot tell them apart")
            per_col.append((eff, tuple(math.log1p(x) for x in eff)))
        object.__setattr__(self, "_mixed_rows", tuple(per_col))

    def padded(self, tokens: float) -> float:
        """The token count a packed step of `tokens` ran at: the first bucket
        that holds it, or its own where none does (or there are none)."""
        buckets = self.packed_buckets
        if not buckets or tokens > buckets[-1]:
            return tokens
        return buckets[bisect.bisect_left(buckets, tokens)]

    def _mixed_chunk(self, chunk: float, batch: float) -> float:
        """The chunk a mixed step's padded forward holds: a packed step pads
        its chunk and decoders together (`padded(chunk + batch) - batch`), a
        per-chunk one its chunk alone (`padded(chunk)`)."""
        if self.step_forwards == "per_chunk":
            return self.padded(chunk)
        return self.padded(chunk + batch) - batch

    def _prefill_cell(self, chunk: float) -> tuple[Grid, tuple[int, float, bool]]:
        """The prefill grid to read (over its rows' bucket sizes with packed
        buckets) and the chunk's cell on its rows, the chunk at its bucket's
        size: `grid.at_row(cell, cached)` is the prefill at (chunk, cached)."""
        grid = self.prefill if self._padded_prefill is None else self._padded_prefill
        return grid, grid.row_cell(self.padded(chunk))

    def _prefill_at(self, chunk: float, cached: float) -> tuple[float, bool]:
        """The prefill grid at (chunk, cached), the chunk at its bucket's size."""
        grid, cell = self._prefill_cell(chunk)
        return _at_cached(grid, cell, self._cached(cached))

    def _cached(self, cached: float) -> float:
        """The cached tokens to read the prefill grid at: a continuing chunk
        (cached > 0) at least at `continuing_cached_tokens`."""
        first = self.continuing_cached_tokens
        return float(first) if first is not None and 0 < cached < first else cached

    def _mixed_at(self, chunk: float, batch: float) -> tuple[float, bool]:
        """The mixed grid at (chunk, batch), read per column (b decoders)
        then log-log between the two columns around `batch`.

        With packed buckets a column is read at the chunk whose step pads to
        the query's bucket, `padded(chunk + batch) - b` (per chunk:
        `padded(chunk)`), along its rows' own padded chunks. Below a column's first row the step lies between a
        decode step of b requests at the grid's reference context (a chunk of
        0 tokens: the decode grid) and that row, linear in the chunk's tokens
        and the time, as a forward that reads all the weights anyway is;
        log-log from 0 would put most of the weight on the row. Per chunk,
        the chunk and the decoders are two forwards, and the chunk's alone
        costs what a forward does however few its tokens (Nemotron-3-Nano:
        19-26 ms for 27-191 tokens, padded and captured, against 8-25 ms
        for its decoders; results/validation/h200/parts.md): below the
        first row the step is that row less the row's chunk alone plus
        this chunk alone, both on the prefill grid (0 cached)."""
        grid = self.mixed
        if not self.packed_buckets and chunk >= grid.rows[0]:
            return grid(chunk, batch)
        j, v, outside = _cell(grid.cols, grid._log_cols, batch)
        per_chunk = self.step_forwards == "per_chunk"
        total = self.padded(chunk) if per_chunk else self.padded(chunk + batch)
        log_t = []
        alone = None  # per chunk, below the first row: (this chunk alone, the row's chunk alone, outside)
        for jj in (j, j + 1):
            b = grid.cols[jj]
            rows, log_rows = self._mixed_rows[jj] if self._mixed_rows else (grid.rows, grid._log_rows)
            x = (total if per_chunk else total - b) if self.packed_buckets else chunk
            if x < rows[0] and per_chunk:  # the chunk's own forward below the row, the decoders' unchanged
                if alone is None:  # the same two reads for both columns
                    (at_c, out_c), (at_r, out_r) = self._prefill_at(chunk, 0), self._prefill_at(grid.rows[0], 0)
                    alone = (at_c, at_r, out_c or out_r)
                at_c, at_r, out_a = alone
                outside = outside or out_a or (0, jj) in grid.filled
                log_t.append(math.log(max(math.exp(grid._log_t[0][jj]) - at_r + at_c, at_c)))
                continue
            if x < rows[0]:
                at_0, out_0 = self.decode(b, self.mixed_context_tokens)
                at_row = math.exp(grid._log_t[0][jj])
                outside = outside or out_0 or (0, jj) in grid.filled
                log_t.append(math.log(at_0 + (at_row - at_0) * max(x, 0.0) / rows[0]))
                continue
            i, u, out_r = _cell(rows, log_rows, x)
            if out_r or (i, jj) in grid.filled and u < 1 or (i + 1, jj) in grid.filled and u > 0:
                outside = True
            log_t.append((1 - u) * grid._log_t[i][jj] + u * grid._log_t[i + 1][jj])
        return math.exp((1 - v) * log_t[0] + v * log_t[1]), outside

    @classmethod
    def load(cls, path: str | Path) -> StepProfile:
        """Read and validate a profile file.

        Raises:
            ValueError: not JSON, or a field missing or out of range: one
                line naming the file and the field.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"profile {str(path)!r}: cannot read it as JSON ({exc})") from None
        try:
            return cls.from_dict(data, path=path)
        except ValueError as exc:
            raise ValueError(f"profile {str(path)!r}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Any, *, path: Path | None = None) -> StepProfile:
        """The profile a file's JSON describes (docs/cost_model.md, "Profiles").

        Raises:
            ValueError: a missing, unknown or out-of-range field, named.
        """
        if not isinstance(data, Mapping):
            raise ValueError("the top level must be a JSON object")
        known = {"format", "version", "model", "gpu", "provenance", "non_forward_s", "moe_touch", "step_forwards",
                 "packed_buckets", "decode_buckets", "decode_padding_routes_as_one", "continuing_cached_tokens",
                 *GRIDS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fields {unknown}; valid: {sorted(known)}")
        for name in ("format", "version", "model", "gpu", "provenance", "non_forward_s", *GRIDS):
            if name not in data:
                raise ValueError(f"missing field {name!r}")
        if data["format"] != FORMAT or data["version"] != VERSION:
            raise ValueError(f"format={data['format']!r}, version={data['version']!r}: expected "
                             f"{FORMAT!r}, {VERSION}")
        for name in ("model", "gpu"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"{name}={data[name]!r} must be a non-empty string")
        mixed = data["mixed"]
        context = mixed.get("context_tokens") if isinstance(mixed, Mapping) else None
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ValueError(f"mixed.context_tokens={context!r} must be a positive integer")
        routes = data.get("decode_padding_routes_as_one", False)
        if not isinstance(routes, bool):
            raise ValueError(f"decode_padding_routes_as_one={routes!r} must be true or false")
        if routes and not data.get("decode_buckets"):
            raise ValueError("decode_padding_routes_as_one=true needs decode_buckets: a step without buckets "
                             "has no padding rows")
        forwards = data.get("step_forwards", "packed")
        if forwards not in STEP_FORWARDS:
            raise ValueError(f"step_forwards={forwards!r} must be one of {list(STEP_FORWARDS)}")
        first = data.get("continuing_cached_tokens")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
            raise ValueError(f"continuing_cached_tokens={first!r} must be a positive integer")
        return cls(model=data["model"], gpu=data["gpu"], provenance=_provenance(data["provenance"]),
                   non_forward_s=_number("non_forward_s", data["non_forward_s"], low=0.0),
                   prefill=_grid("prefill", data["prefill"], linear_cols=True), decode=_grid("decode", data["decode"]),
                   mixed=_grid("mixed", data["mixed"], extra=("context_tokens",)),
                   mixed_context_tokens=context, moe_touch=_moe_touch(data.get("moe_touch", [])),
                   step_forwards=forwards, packed_buckets=_buckets("packed_buckets", data.get("packed_buckets", [])),
                   decode_buckets=_buckets("decode_buckets", data.get("decode_buckets", [])),
                   decode_padding_routes_as_one=routes, continuing_cached_tokens=first, path=path)

    def forward_s(self, *, chunk_tokens: float, cached_tokens: float, batch: int,
                  context_tokens: float) -> tuple[float, bool]:
        """(forward seconds of a step, whether any grid was extrapolated).

        Args:
            chunk_tokens / cached_tokens: the step's prefill tokens and the
                cached context they attend (0 / 0: no prefill).
            batch / context_tokens: decoders and their mean context (0: none).

        A mixed step is the mixed grid at (chunk, batch) plus how the
        prefill grid moves from 0 cached tokens to `cached_tokens` and how
        the decode grid moves from the mixed grid's reference context to
        `context_tokens` (the two context effects assumed additive). A
        decode-only step with `decode_buckets` adds its bucket's padding
        (`decode_padding_s`).
        """
        if batch == 0:
            return self._prefill_at(chunk_tokens, cached_tokens)
        if chunk_tokens == 0:
            forward, outside = self.decode(batch, context_tokens)
            if self.decode_buckets:
                pad, out_pad = self.decode_padding_s(batch)
                forward, outside = forward + pad, outside or out_pad
            return forward, outside
        base, out_m = self._mixed_at(chunk_tokens, batch)
        prefill, cell = self._prefill_cell(chunk_tokens)  # one row lookup for both contexts
        pre, out_p = _at_cached(prefill, cell, self._cached(cached_tokens))
        pre0, out_0 = prefill.at_row(cell, 0)
        dec, out_d = self.decode(batch, context_tokens)
        dec0, out_r = self.decode(batch, self.mixed_context_tokens)
        total = base + (pre - pre0) + (dec - dec0)
        return max(total, 0.0), out_m or out_p or out_0 or out_d or out_r

    def decode_bucket(self, batch: int) -> int:
        """The batch a decode step of `batch` requests ran at: the first
        decode bucket that holds it, or its own where none does (or there
        are none)."""
        buckets = self.decode_buckets
        if not buckets or batch > buckets[-1]:
            return batch
        return buckets[bisect.bisect_left(buckets, batch)]

    def decode_padding_s(self, batch: int) -> tuple[float, bool]:
        """(seconds a decode step of `batch` requests spends on the padding
        rows its bucket adds, whether a read lay outside the grid's rows).

        A padding row runs every matmul (and, in an MoE model, routes
        through experts) but attends nothing. So the step costs the decode
        grid's part that does not grow with context at its bucket's batch,
        and its context effect at its own batch: `decode(batch, L) +
        at_0(bucket) - at_0(batch)`, `at_0(n)` being row n extended to
        context 0 on the line through the grid's first two context columns
        (slope >= 0). The intercepts lie below the measured contexts, but
        their difference is along measured rows and cancels the line's own
        error to first order, so it is not flagged: flagging it would mark
        every padded step.

        With `decode_padding_routes_as_one` (an MoE model without state:
        the padding rows, all token 0 at position 0, pick one set of
        experts) the part is read at batch + 1, capped at the bucket,
        instead: one more token's experts, the padding rows' other per-row
        work left out as small."""
        bucket = self.decode_bucket(batch)
        if bucket == batch:
            return 0.0, False
        top = min(bucket, batch + 1) if self.decode_padding_routes_as_one else bucket
        (at_n, out_n), (at_b, out_b) = self._decode_at_0(top), self._decode_at_0(batch)
        return max(at_n - at_b, 0.0), out_n or out_b

    def _decode_at_0(self, batch: float) -> tuple[float, bool]:
        """(decode row `batch` extended to context 0 on the line through the
        grid's first two context columns, slope >= 0; whether the row lay
        outside the grid's rows): the part of a step that does not grow
        with context."""
        return _on_first_line(self.decode, self.decode.row_cell(batch), 0.0)

    def step_forward_s(self, prefill: Sequence[tuple[int, int]], batch: int,
                       context_tokens: float) -> tuple[float, bool]:
        """(forward seconds of a step, whether any grid was extrapolated),
        its prefill given chunk by chunk.

        Args:
            prefill: (chunk tokens, cached tokens) of each prefill chunk.
            batch / context_tokens: decoders and their mean context.

        "packed": the chunks merged into one (`effective_cached_tokens`),
        then `forward_s`. "per_chunk": the first chunk with the decoders
        by `forward_s` (the mixed grid measured that pair of forwards),
        plus each further chunk's own forward from the prefill grid.
        """
        if self.step_forwards == "packed" or len(prefill) < 2:
            chunk, cached = effective_cached_tokens(prefill)
            return self.forward_s(chunk_tokens=chunk, cached_tokens=cached, batch=batch,
                                  context_tokens=context_tokens)
        (chunk, cached), *rest = prefill
        total, outside = self.forward_s(chunk_tokens=chunk, cached_tokens=cached, batch=batch,
                                        context_tokens=context_tokens)
        for chunk, cached in rest:
            more, out = self._prefill_at(chunk, cached)
            total, outside = total + more, outside or out
        return total, outside


def _provenance(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"provenance={value!r} must be an object")
    for name in PROVENANCE_FIELDS:
        if not isinstance(value.get(name), str) or not value[name]:
            raise ValueError(f"provenance.{name}={value.get(name)!r} must be a non-empty string")
    return dict(value)


def _buckets(name: str, value: Any) -> tuple[int, ...]:
    ok = (isinstance(value, Sequence) and not isinstance(value, str)
          and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value))
    if not ok or any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"{name}={value!r} must be a strictly increasing list of positive "
                         f"{'token counts' if name == 'packed_buckets' else 'batch sizes'}")
    return tuple(value)


def _number(name: str, value: Any, *, low: float, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value > low if open_low else value >= low):
        raise ValueError(f"{name}={value!r} must be a finite number {'>' if open_low else '>='} {low}")
    return float(value)


def _axis(name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) < 2:
        raise ValueError(f"{name}={value!r} must be a list of at least 2 numbers")
    points = tuple(_number(f"{name}[{i}]", v, low=0.0) for i, v in enumerate(value))
    if any(b <= a for a, b in zip(points, points[1:])):
        raise ValueError(f"{name}={list(value)!r} must be strictly increasing")
    return points


def _grid(name: str, value: Any, extra: tuple[str, ...] = (), linear_cols: bool = False) -> Grid:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}={value!r} must be an object")
    row_name, col_name = GRIDS[name]
    unknown = sorted(set(value) - {row_name, col_name, "forward_s", "filled", *extra})
    if unknown:
        raise ValueError(f"{name}: unknown fields {unknown}; valid: "
                         f"{[row_name, col_name, 'forward_s', 'filled', *extra]}")
    rows, cols = _axis(f"{name}.{row_name}", value.get(row_name)), _axis(f"{name}.{col_name}", value.get(col_name))
    table = value.get("forward_s")
    if not isinstance(table, Sequence) or len(table) != len(rows):
        raise ValueError(f"{name}.forward_s must be a list of {len(rows)} rows (one per {row_name})")
    out = []
    for i, row in enumerate(table):
        if not isinstance(row, Sequence) or len(row) != len(cols):
            raise ValueError(f"{name}.forward_s[{i}] must hold {len(cols)} numbers (one per {col_name})")
        out.append(tuple(_number(f"{name}.forward_s[{i}][{j}]", v, low=0.0, open_low=True)
                         for j, v in enumerate(row)))
    return Grid(rows=rows, cols=cols, forward_s=tuple(out), filled=_filled(name, value.get("filled"), rows, cols),
                linear_cols=linear_cols)


def _filled(name: str, value: Any, rows: tuple, cols: tuple) -> frozenset[tuple[int, int]]:
    """The `filled` mask (rows x cols booleans: True = extrapolated, not
    measured) as a set of cells; absent = every cell measured."""
    if value is None:
        return frozenset()
    ok = isinstance(value, Sequence) and len(value) == len(rows) and all(
        isinstance(r, Sequence) and len(r) == len(cols) and all(isinstance(b, bool) for b in r) for r in value)
    if not ok:
        raise ValueError(f"{name}.filled must be {len(rows)} rows of {len(cols)} booleans (True: not measured)")
    cells = frozenset((i, j) for i, r in enumerate(value) for j, b in enumerate(r) if b)
    if len(cells) == len(rows) * len(cols):
        raise ValueError(f"{name}.filled marks every cell: nothing in the grid was measured")
    return cells


def fill_unmeasured(rows: Sequence[float], cols: Sequence[float],
                    table: Sequence[Sequence[float | None]]) -> tuple[list[list[float]], list[list[bool]]]:
    """A grid's table with its unmeasured cells (None: the GPU could not
    hold the point's KV) extrapolated, and the `filled` mask to store with it.

    A row with at least two measured cells is extended along its columns by
    the log-log slope (in the interpolation's log1p axis) of its last two
    measured cells; cells still empty are then extended down their column
    from the two highest rows that hold values. The cost model flags every
    step that reads a filled cell (`Grid.__call__`), as it flags steps
    beyond the axes.

    Raises:
        ValueError: a cell that neither direction can reach (fewer than two
            values in its row and in its column).
    """
    out = [list(r) for r in table]
    mask = [[v is None for v in r] for r in table]

    def extend(points: list[tuple[float, float]], x: float) -> float:
        (x0, t0), (x1, t1) = points[-2], points[-1]
        slope = (math.log(t1) - math.log(t0)) / (math.log1p(x1) - math.log1p(x0))
        return math.exp(math.log(t1) + slope * (math.log1p(x) - math.log1p(x1)))

    for r in out:
        known = [(cols[j], v) for j, v in enumerate(r) if v is not None]
        if len(known) >= 2:
            for j, v in enumerate(r):
                if v is None:
                    r[j] = extend(known, cols[j])
    for j in range(len(cols)):
        known = [(rows[i], out[i][j]) for i in range(len(rows)) if out[i][j] is not None]
        for i in range(len(rows)):
            if out[i][j] is None:
                if len(known) < 2:
                    raise ValueError(f"cell ({rows[i]}, {cols[j]}): too few measured neighbours to extrapolate it")
                out[i][j] = extend([k for k in known if k[0] < rows[i]] or known, rows[i])
    return out, mask


def _moe_touch(value: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, Mapping) and value == []:
        return ()
    if not isinstance(value, Mapping) or set(value) != {"batch_tokens", "experts_touched"}:
        raise ValueError(f"moe_touch={value!r} must be an object with 'batch_tokens' and 'experts_touched'")
    tokens, touched = value["batch_tokens"], value["experts_touched"]
    if not isinstance(tokens, list) or not isinstance(touched, list) or len(tokens) != len(touched):
        raise ValueError("moe_touch.batch_tokens and moe_touch.experts_touched must be lists of one length")
    return tuple((int(_number(f"moe_touch.batch_tokens[{i}]", n, low=1.0)),
                  _number(f"moe_touch.experts_touched[{i}]", e, low=0.0)) for i, (n, e) in enumerate(zip(tokens, touched)))


def profile_path(model: str, gpu: str, profiles_dir: Path | None = None) -> Path:
    """Where the profile of (model, gpu) lives: `<dir>/<model>__<gpu>.json`
    (default dir: the bundled `sim/data/profiles/`)."""
    root = Path(str(resources.files("unikv.sim").joinpath("data", "profiles"))) if profiles_dir is None \
        else Path(profiles_dir)
    return root / f"{model}__{gpu}.json"


def padding_routes_as_one(model) -> bool:
    """Whether a decode step's padding rows cost only one more token's
    expert routing (a profile's `decode_padding_routes_as_one`): `model` (a
    `ModelSpec`) routes tokens through experts and keeps no recurrent
    state. The decode graphs' padding rows are all token 0 at position 0,
    so they pick one set of experts; their other per-row work is small
    beside the experts' weights in a model without state. A model with
    recurrent state gathers and scatters every padding row's state (47 MiB
    a row for Nemotron-3-Nano), per-row work its bucket's row measures."""
    return model.routed_experts is not None and model.state_layers == 0


def effective_cached_tokens(prefill: Sequence[tuple[int, int]]) -> tuple[int, float]:
    """(chunk tokens C, cached tokens p) of one chunk attending as many
    (query, key) pairs as the step's chunks do together:
    C p + C (C + 1) / 2 = sum of c_i p_i + c_i (c_i + 1) / 2.

    p < 0 where the chunks attend fewer pairs than one causal chunk of C
    tokens would: several requests' prompts packed into one step, each
    attending only its own tokens (down to -(C - 1) / 2, C one-token
    chunks). The prefill grid reads such a p along its first column cell
    (`_at_cached`)."""
    chunk = sum(c for c, _ in prefill)
    if chunk == 0:
        return 0, 0.0
    pairs = sum(c * p + c * (c + 1) / 2 for c, p in prefill)
    return chunk, (pairs - chunk * (chunk + 1) / 2) / chunk


def _at_cached(grid: Grid, cell: tuple[int, float, bool], cached: float) -> tuple[float, bool]:
    """The prefill grid at (its row `cell`, `cached` tokens), `cached` < 0
    (fewer pairs than one causal chunk, `effective_cached_tokens`) read on
    the line through the first two columns: a chunk's attention is affine
    in its (query, key) pairs, as the grid's linear cached axis has it. The
    slope is kept >= 0 (fewer pairs never cost more). Such a point lies
    below the measured pair counts, but only by the chunk's own causal
    pairs (at most C (C - 1) / 2 fewer, one pair per token left) on a
    measured row, along the attention's own affine cost, so it is not
    flagged as extrapolated: flagging it would mark every step that packs
    two prompts."""
    if cached >= 0:
        return grid.at_row(cell, cached)
    seconds, outside = _on_first_line(grid, cell, cached)
    # a grid whose cached axis starts above 0 was not measured there: flagged
    return seconds, outside or grid.cols[0] > 0


def _on_first_line(grid: Grid, cell: tuple[int, float, bool], col: float) -> tuple[float, bool]:
    """(the grid's row `cell` at `col` below its first column, on the line
    through its first two columns with the slope kept >= 0 and the time
    >= 0; whether those two reads lay outside the grid's rows)."""
    c0, c1 = grid.cols[:2]
    (at_0, out_0), (at_1, out_1) = grid.at_row(cell, c0), grid.at_row(cell, c1)
    slope = max(at_1 - at_0, 0.0) / (c1 - c0)
    return max(at_0 + slope * (col - c0), 0.0), out_0 or out_1


class ProfileStepCost:
    """Step times interpolated from a `StepProfile`, called as the roofline is
    (`sim.cost.EngineStepCost`): `(prefill_tokens, decode_tokens,
    kv_bytes_read, moved_bytes, shape) -> seconds`, page moves charged at
    the accelerator's `move_bytes_per_s`.

    Args:
        profile: the measurements.
        hw: the accelerator (its move bandwidth).
        window_tokens: the model's window (None: none), for `shape_of`.
    """

    reads_kv_bytes = False  # the measured forward times include the KV reads

    def __init__(self, profile: StepProfile, hw, window_tokens: int | None = None) -> None:
        from unikv.sim.roofline import shape_of

        self.profile, self.hw = profile, hw
        self.name = f"profile:{profile.path.name if profile.path else profile.model}"
        self.extrapolated_steps = 0
        self.window_tokens = window_tokens
        self.shape_of = lambda plan, memory: shape_of(plan, memory, window_tokens)
        # batch -> (its cell on the decode grid's row axis, its bucket's padding seconds,
        # whether they read outside the rows): the grid never changes, so neither do they;
        # a run sees a few dozen batches
        self._decode_rows: dict[int, tuple[tuple[int, float, bool], float, bool]] = {}

    def __call__(self, prefill_tokens: int, decode_tokens: int, kv_bytes_read: int,
                 moved_bytes: int, shape=None) -> float:
        move_s = self.move_time_s(moved_bytes)
        if prefill_tokens + decode_tokens == 0:
            return move_s
        if shape is None:
            raise ValueError("ProfileStepCost needs the step's shape (its chunks and contexts)")
        context = shape.decode_context_tokens / decode_tokens if decode_tokens else 0.0
        forward, outside = self.profile.step_forward_s(shape.prefill, decode_tokens, context)
        self.extrapolated_steps += outside
        return self.profile.non_forward_s + forward + move_s

    def decode_s(self, decode_tokens: int, decode_context_tokens: int, decode_window_tokens: int,
                 kv_bytes_read: int, moved_bytes: int) -> float:
        """`self(0, decode_tokens, kv_bytes_read, moved_bytes, shape)` of a
        step that only decodes, `shape` being `StepShape((),
        decode_context_tokens, decode_window_tokens)`, with no shape built
        (the executor's path for such steps): the decode grid at (batch,
        mean context) plus its bucket's padding (`StepProfile.
        decode_padding_s`), the batch's row cell and padding kept."""
        move_s = self.move_time_s(moved_bytes)
        if decode_tokens == 0:
            return move_s
        decode = self.profile.decode
        kept = self._decode_rows.get(decode_tokens)
        if kept is None:
            kept = self._decode_rows[decode_tokens] = (decode.row_cell(decode_tokens),
                                                       *self.profile.decode_padding_s(decode_tokens))
        cell, pad, out_pad = kept
        forward, outside = decode.at_row(cell, decode_context_tokens / decode_tokens)
        self.extrapolated_steps += outside or out_pad
        return self.profile.non_forward_s + (forward + pad) + move_s

    def move_time_s(self, moved_bytes):
        """Seconds the page moves take (an int or an array of byte counts)."""
        return 2 * moved_bytes / self.hw.move_bytes_per_s
