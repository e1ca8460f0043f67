#!/usr/bin/env python3
"""Host-to-device copy bandwidth on the GPU machine (torch), pinned against pageable host memory,
at the sizes the GPU/CPU split's matmul offload streams (backend/matmul_offload.h: one layer
matrix per product, e.g. TinyLlama's 2048 x 11264 gate-up in bf16 = 46 MB). Prints GB/s (1e9)."""
import time

import torch


def bandwidth(size_bytes, pinned, reps=20):
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=pinned)
    host.fill_(1)
    dev = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        dev.copy_(host, non_blocking=False)
    torch.cuda.synchronize()
    return size_bytes * reps / (time.perf_counter() - start) / 1e9


print(torch.cuda.get_device_name(0))
for mb in (8, 46, 88, 256):
    size = mb << 20
    print(f"{mb:4d} MiB: pinned {bandwidth(size, True):6.1f} GB/s, pageable {bandwidth(size, False):6.1f} GB/s")
