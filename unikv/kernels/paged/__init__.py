"""Paged-alloc kernels on the device: paged_extend, paged_decode.

`reference` (torch), `kernel` (Triton launchers; imports Triton). No backend
calls them (the pool computes ids on the host, `unikv.paged`, held equal to
these references): public kernels for engines that keep their page tables
and free lists on the device.
"""
