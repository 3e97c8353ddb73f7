"""Typed tensors over a pool's one byte buffer: per-layer KV views (`kv`) and
per-layer recurrent-state views (`state`), and the engine's
per-request rows of virtual pages on the device (`rows`).

Imports torch (the base install's `import unikv` never imports this
package).
"""

from unikv.tensors.kv import KVViews, LayerKV
from unikv.tensors.rows import PageRows
from unikv.tensors.state import LayerState, StateViews

__all__ = ["KVViews", "LayerKV", "LayerState", "PageRows", "StateViews"]
