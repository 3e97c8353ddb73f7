"""Page-table and page-move kernels.

`reference` holds the plain-torch implementation of every kernel contract;
backends call these (the sim backend directly, the cuda backend through its
Triton versions, which are tested against the references).
"""

from unikv.kernels import reference

__all__ = ["reference"]
