"""Page-table kernels on device tables: bind, alloc_bind, free_unbind, remap_moved.

`reference` (torch), `kernel` (Triton launchers; imports Triton). No backend
calls them (unikv's tables' truth is on the host): they are public kernels
for engines that keep their page tables on the device.
"""
