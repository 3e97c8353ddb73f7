"""Typed tensors over a pool's one byte buffer: per-layer KV views (`kv`).

Imports torch (the base install's `import unikv` never imports this
package).
"""

from unikv.tensors.kv import KVViews, LayerKV

__all__ = ["KVViews", "LayerKV"]
