"""The real executor's model side: a transformers model whose attention reads
and writes the pool (`attention`), the per-layer description of a model's
cache read from its config (`layers`), recurrent state gathered from and scattered to the pool's state
slots around a forward (`state`), and the executor itself.

Needs torch and transformers; `import unikv.sim` never imports this package.
"""
