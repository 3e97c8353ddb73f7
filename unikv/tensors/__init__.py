"""Tensor views over a pool's one byte buffer (they need torch)."""

from unikv.tensors.state import LayerState, StateViews

__all__ = ["LayerState", "StateViews"]
