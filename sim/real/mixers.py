"""transformers' Mamba-2 mixers run the executor's captured paths for a cache that asks for one.

The captured steps of a model with Mamba-2 mixers (Nemotron-H) run the
mixer two ways transformers' own forward (`NemotronHMamba2Mixer.forward`,
modeling_nemotron_h.py, 5.17 and 5.24) does not:

- a prefill chunk padded to its token bucket (`sim.real.padded_chunk`): the
  cache carries a `ChunkLength` as `unikv_chunk`;
- a decode token updating its state in the pool's slot
  (`sim.real.slot_decode`): the cache carries a `DecodeSlots` as
  `unikv_slots`.

`served_mixers(model)` puts a dispatching forward in place of the mixer
class's forward for a `with` block: it runs the path the cache carries and
transformers' forward for any other call (a cache without either, a
positional argument); the class's own forward is back after the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_FIELDS = ("in_proj", "conv1d", "out_proj", "norm", "A_log", "D", "dt_bias", "conv_dim", "conv_kernel_size",
           "intermediate_size", "num_heads", "head_dim", "n_groups", "ssm_state_size", "chunk_size",
           "time_step_limit", "activation", "layer_idx")


def is_mamba2(module) -> bool:
    """Whether `module` is a Mamba-2 mixer the served paths run: transformers'
    fields of `NemotronHMamba2Mixer` (its projections, conv, norm, scan
    parameters)."""
    return all(hasattr(module, f) for f in _FIELDS)


def mamba2_only(model, path: str) -> str | None:
    """Why `model`'s recurrent layers cannot all run `path` (None: they can):
    every recurrent layer must be a Mamba-2 mixer (a short-conv layer,
    LFM2's, keeps transformers' path)."""
    from unikv.sim.real.state import is_recurrent

    other = sorted({type(m).__name__ for m in model.modules() if is_recurrent(m) and not is_mamba2(m)})
    if other:
        return f"recurrent layers {', '.join(other)} have no {path} (only Mamba-2 mixers do)"
    return None


@contextlib.contextmanager
def served_mixers(model) -> Iterator[None]:
    """Inside the block, `model`'s Mamba-2 mixers run the path their cache
    carries (module docstring), transformers' forward for any other call;
    the class's forward is restored after."""
    classes = {type(m) for m in model.modules() if is_mamba2(m)}
    saved = {cls: cls.__dict__.get("forward") for cls in classes}
    for cls in classes:
        cls.forward = _dispatch(cls.forward)
    try:
        yield
    finally:
        for cls, own in saved.items():
            if own is None:
                del cls.forward
            else:
                cls.forward = own


def _dispatch(original):
    from unikv.sim.real.padded_chunk import CHUNK_ATTR, padded_forward
    from unikv.sim.real.slot_decode import SLOTS_ATTR, slot_forward

    def forward(self, hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("cache_params"))
        chunk, slots = getattr(cache, CHUNK_ATTR, None), getattr(cache, SLOTS_ATTR, None)
        if args or (chunk is None and slots is None):
            return original(self, hidden_states, *args, **kwargs)
        if chunk is not None:
            return padded_forward(self, hidden_states, cache, chunk, kwargs.get("attention_mask"))
        return slot_forward(self, hidden_states, slots, kwargs.get("attention_mask"))

    forward.__wrapped__ = original
    return forward
