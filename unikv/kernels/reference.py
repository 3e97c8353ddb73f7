"""Every kernel's plain-torch reference, in one namespace.

Each reference lives beside its Triton kernel (`<operator>/reference.py`);
this module gathers them for callers that want the torch versions only
(tests of the host twins in `unikv.paged`, torch fallbacks). Imports torch,
never Triton.
"""

from unikv.kernels.move.reference import move_pages, page_rows
from unikv.kernels.paged.reference import new_page_counts, paged_decode, paged_extend
from unikv.kernels.tables.reference import alloc_bind, bind, free_unbind, remap_moved
from unikv.kernels.translate.reference import translate

__all__ = [
    "alloc_bind", "bind", "free_unbind", "move_pages", "new_page_counts", "page_rows", "paged_decode",
    "paged_extend", "remap_moved", "translate",
]
