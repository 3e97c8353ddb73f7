"""Typed tensors over a pool's one byte buffer: per-layer KV views (`kv`) and
per-layer recurrent-state views (`state`).

Imports torch (the base install's `import unikv` never imports this
package).
"""

from unikv.tensors.kv import KVViews, LayerKV
from unikv.tensors.state import LayerState, StateViews

__all__ = ["KVViews", "LayerKV", "LayerState", "StateViews"]
