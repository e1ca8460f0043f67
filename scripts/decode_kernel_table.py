#!/usr/bin/env python3
"""Per-kernel table of the last decode steps from an `ncu --csv --page raw` log.

Each forward starts with embed_kernel; the last STEPS forwards are decode steps (the bench ends
with them). Prints kernel, calls per step, µs per step, share. Usage: decode_kernel_table.py LOG STEPS
"""
import csv, io, sys
from collections import defaultdict

text = open(sys.argv[1]).read()
steps = int(sys.argv[2])
rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
header = rows[0]
name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
launches = []
for r in rows[2:]:  # rows[1] holds the units
    if len(r) > time_col and r[time_col]:
        launches.append((r[name_col], float(r[time_col].replace(",", ""))))
unit = rows[1][time_col]
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[unit]
starts = [i for i, (n, _) in enumerate(launches) if n.startswith("embed_kernel") or "embed_kernel" in n]
chosen = launches[starts[-steps]:]
calls, total = defaultdict(int), defaultdict(float)
for n, t in chosen:
    short = n.replace("(anonymous namespace)::", "").split("(")[0][:70]
    calls[short] += 1
    total[short] += t * scale
all_us = sum(total.values())
print(f"{'kernel':70s} {'calls/step':>10s} {'us/step':>9s} {'share':>6s}")
for k in sorted(total, key=total.get, reverse=True):
    print(f"{k:70s} {calls[k] / steps:10.1f} {total[k] / steps:9.1f} {100 * total[k] / all_us:5.1f}%")
print(f"{'total (GPU time, kernels back to back)':70s} {len(chosen) / steps:10.1f} {all_us / steps:9.1f}")
