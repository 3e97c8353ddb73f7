"""`move_pages`: copy page rows of one band's grid (compaction, relocation).

`reference` (torch), `kernel` (Triton launcher; imports Triton), `plan` (the
host planning of overlapping batches; numpy only). Called by `CudaBackend`.
"""
