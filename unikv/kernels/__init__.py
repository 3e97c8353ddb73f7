"""Triton kernels for page tables and page moves, each beside its torch reference.

One folder per operator: `reference.py` (readable torch, the contract),
`kernel.py` (the Triton kernel and a launcher that checks shapes, dtypes and
devices and raises a one-line ValueError naming the bad argument). Tests:
`tests/kernels/`; benchmark: `benchmarks/bench_kernels.py`; details:
`docs/kernels.md`.

| launcher | computes | called by |
| --- | --- | --- |
| `move_pages(buffer, page_bytes, src, dst)` | page rows src[i] -> dst[i], overlap allowed | `CudaBackend.move_pages` |
| `translate(v_tokens, v2p, page_size, multiplier)` | virtual token ids -> physical ids, tombstones -> 0 | `CudaBackend.translate` |
| `bind(v, p, v2p, p2v)` | v[i] <-> p[i] in both tables | public (device-table engines) |
| `alloc_bind(v, start, v2p, p2v)` | v[i] <-> start + i; returns the pages | public |
| `free_unbind(v, v2p, p2v)` | tombstone v; returns the pages held | public |
| `remap_moved(src, dst, v2p, p2v)` | rebind the virtual pages at src to dst | public |
| `paged_extend(prefix, seq, last_loc, new_pages, ps)` | ids of positions [prefix, seq), tail-page reuse | public |
| `paged_decode(seq, last_loc, new_pages, ps)` | one id per request at seq - 1 | public |

Launchers live in `unikv.kernels.<operator>.kernel` (e.g.
`from unikv.kernels.move.kernel import move_pages`), references in
`unikv.kernels.<operator>.reference` and, all together, in
`unikv.kernels.reference`.

`import unikv` never imports this package. Importing `unikv.kernels`, an
operator package or a reference imports torch at most; a `kernel` module
imports Triton (the `cuda` extra). Set `TRITON_INTERPRET=1` before Triton's
first import to run the kernels on CPU tensors through its interpreter.
"""

__all__ = ["launch", "move", "paged", "reference", "tables", "translate"]
