"""`translate`: virtual token ids -> physical slot or kernel-facing ids.

`reference` (torch), `kernel` (Triton launcher; imports Triton). Called by
`CudaBackend.translate` (the pool's `translate` of device ids).
"""
