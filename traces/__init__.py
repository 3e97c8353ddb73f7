"""LLM request traces: loaders, transforms, synthetic generators, bundled samples.

Every function returns the one schema of :mod:`traces.schema`: a DataFrame
with ``arrival_s``, ``prompt_tokens``, ``output_tokens`` and optionally
``prefix_hashes``, with metadata in ``df.attrs``. See ``docs/traces.md``.
"""

from unikv.traces.formats import known_formats
from unikv.traces.loaders import load, load_head
from unikv.traces.prefixes import (
    BlockIds,
    ConversationSpec,
    conversation_trace,
    regroup_blocks,
    shared_prefix_trace,
    with_unique_hashes,
)
from unikv.traces.samples import load_sample
from unikv.traces.schema import (
    REQUIRED_COLUMNS,
    TraceFormatError,
    TraceMeta,
    TraceWarning,
    make_frame,
    meta_of,
    validate,
    with_meta,
)
from unikv.traces.stats import summarize
from unikv.traces.synthetic import (
    EmpiricalLengths,
    FixedLengths,
    LengthSampler,
    LognormalLengths,
    gamma_arrivals,
    poisson_arrivals,
    synthetic_trace,
)
from unikv.traces.transforms import (
    clip_to_context,
    concat,
    repeat,
    scale_rate,
    spread_buckets,
    subsample,
    window,
)
from unikv.traces.writers import save

__all__ = [
    "REQUIRED_COLUMNS",
    "BlockIds",
    "ConversationSpec",
    "EmpiricalLengths",
    "FixedLengths",
    "LengthSampler",
    "LognormalLengths",
    "TraceFormatError",
    "TraceMeta",
    "TraceWarning",
    "clip_to_context",
    "concat",
    "conversation_trace",
    "gamma_arrivals",
    "known_formats",
    "load",
    "load_head",
    "load_sample",
    "make_frame",
    "meta_of",
    "poisson_arrivals",
    "regroup_blocks",
    "repeat",
    "save",
    "scale_rate",
    "shared_prefix_trace",
    "spread_buckets",
    "subsample",
    "summarize",
    "synthetic_trace",
    "validate",
    "window",
    "with_meta",
    "with_unique_hashes",
]
