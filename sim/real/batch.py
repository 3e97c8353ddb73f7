"""A planned step (`StepPlan`) as one forward's inputs over the pool.

The scheduler plans a step and allocates its memory; this module reads the
plan and the pool and builds what the model and the attention function need:

- `input_ids` / `position_ids`: packed `[1, T]` (every request's new tokens
  concatenated in batch order: prefill chunks, then decoders) for a step
  with any prefill, padded `[B, 1]` for a decode-only step;
- `cu_q` `[B+1]` (prefix sums of the query counts) and `seq_lens` `[B]` (KV
  length after this step's writes), as the paged-attention op reads them;
- per token band, `block_tables[band]` `[B, W]` (request b's j-th virtual
  page translated to its physical page on the band; released and unbound
  pages read 0, the sink) and `write_slots[band]` `[T]` (the physical slot
  each new token's K/V goes to: `pool.translate(virtual token ids, band)`);
- `sample_rows`: the rows of the `T` tokens whose logits give a new token
  (a decoder's one token; the last token of a prefill that completes a
  first admission's prompt), and `samplers`, their requests.

A request readmitted after a retraction recomputes its prompt and all but
its newest generated token; that prefill samples nothing (its next token is
already known: the newest generated one, the next decode's input).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from unikv.sim.real.tokens import TokenSource
from unikv.sim.request import Request
from unikv.sim.scheduler import StepPlan


@dataclass(frozen=True, kw_only=True)
class StepBatch:
    """One forward's inputs (torch tensors on the model's device).

    Attributes:
        layout: "packed" (`[1, T]` inputs) or "padded" (`[B, 1]`, decode only).
        input_ids, position_ids: int64, shaped by `layout`.
        cu_q: `[B+1]` int32; seq_lens: `[B]` int32.
        block_tables: token band -> `[B, W]` int32 physical pages.
        write_slots: token band -> `[T]` int64 physical slots.
        sample_rows: `[S]` int64 rows of the step's tokens whose logits are sampled.
        samplers: the S requests those rows give a token to, in row order.
        requests: the batch (prefills, then decoders).
    """

    layout: str
    input_ids: Any
    position_ids: Any
    cu_q: Any
    seq_lens: Any
    block_tables: Mapping[str, Any]
    write_slots: Mapping[str, Any]
    sample_rows: Any
    samplers: tuple[Request, ...]
    requests: tuple[Request, ...]

    @property
    def num_tokens(self) -> int:
        return int(self.position_ids.numel())


def _spans(plan: StepPlan) -> list[tuple[Request, int, int, bool]]:
    """(request, first position, last position + 1, samples) in batch order."""
    out = []
    for r, chunk in plan.prefill:
        first_done = r.prefilled + chunk == r.prefill_target and r.generated == 0
        out.append((r, r.seq - chunk, r.seq, first_done))
    out.extend((r, r.seq - 1, r.seq, True) for r in plan.decode)
    return out


def _vids(r: Request, start: int, stop: int, ps: int) -> np.ndarray:
    """Virtual token ids of positions `[start, stop)` of `r`."""
    pos = np.arange(start, stop, dtype=np.int64)
    pages = np.asarray(r.pages, dtype=np.int64)
    return pages[pos // ps] * ps + pos % ps


def _tensor(x, device):
    """A translate answer as a torch tensor on `device`: a host numpy array
    is wrapped (no copy) and uploaded once, a device tensor (a CUDA pool's
    answer) stays where it is: no round trip through the host."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return t.to(device=device, dtype=torch.int64)


def block_tables(pool, requests: Sequence[Request], bands: Sequence[str], device: Any = "cpu") -> dict:
    """Per band, `[B, W]` int32 physical pages (torch, on `device`) of each
    request's virtual pages (W: the most pages a request holds; padding and
    released pages 0)."""
    import torch

    ps = pool.page_size
    counts = [len(r.pages) for r in requests]
    width = max(max(counts, default=0), 1)
    flat = np.array([p for r in requests for p in r.pages], dtype=np.int64) * ps
    # row-major flat index of each page's cell in the [B, W] table
    cells = np.concatenate([np.arange(c) + b * width for b, c in enumerate(counts)]) if flat.size \
        else np.empty(0, np.int64)
    where = torch.from_numpy(cells).to(device)
    out = {}
    for band in bands:
        table = torch.zeros(len(requests) * width, dtype=torch.int32, device=device)
        if flat.size:
            table[where] = (_tensor(pool.translate(flat, band), device) // ps).to(torch.int32)
        out[band] = table.reshape(len(requests), width)
    return out


def build_batch(plan: StepPlan, pool, tokens: TokenSource, generated: Mapping[int, Sequence[int]],
                bands: Sequence[str], device: Any = "cpu") -> StepBatch:
    """The forward's inputs for `plan` (its memory already allocated).

    Args:
        pool: the run's pool (translates virtual ids; its page size).
        tokens: the prompt ids.
        generated: request id -> the tokens the model generated so far.
        bands: the token bands the model's layers store on.
        device: where the tensors go (the model's device).
    Raises:
        ValueError: an empty plan.
    """
    import torch

    spans = _spans(plan)
    if not spans:
        raise ValueError(f"build_batch: step {plan.index} plans no request")
    ps = pool.page_size
    ids = [tokens.ids(r, a, b, generated.get(r.rid, ())) for r, a, b, _ in spans]
    pos = [np.arange(a, b, dtype=np.int64) for _, a, b, _ in spans]
    vids = np.concatenate([_vids(r, a, b, ps) for r, a, b, _ in spans])
    q_lens = np.array([b - a for _, a, b, _ in spans], dtype=np.int64)
    rows = np.cumsum(q_lens) - 1
    samples = [i for i, s in enumerate(spans) if s[3]]
    layout = "packed" if plan.prefill else "padded"
    shape = (1, -1) if layout == "packed" else (-1, 1)
    batch = [r for r, *_ in spans]

    def dev(a, dtype):
        return torch.as_tensor(np.ascontiguousarray(a), device=device).to(dtype)

    writes = {band: _tensor(pool.translate(vids, band), device) for band in bands}
    tables = block_tables(pool, batch, bands, device)
    return StepBatch(
        layout=layout,
        input_ids=dev(np.concatenate(ids), torch.int64).reshape(shape),
        position_ids=dev(np.concatenate(pos), torch.int64).reshape(shape),
        cu_q=dev(np.concatenate([[0], np.cumsum(q_lens)]), torch.int32),
        seq_lens=dev(np.array([b for _, _, b, _ in spans]), torch.int32),
        block_tables=tables, write_slots=writes,
        sample_rows=dev(rows[samples], torch.int64),
        samplers=tuple(batch[i] for i in samples), requests=tuple(batch))
