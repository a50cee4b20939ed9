"""shim_lab.py MODE [CASE...] -- the laboratory cases
(how PyTorch's caching allocator fragments: bench/workloads.py) through PyTorch, for the shim's GPU check
(scripts/gpu-shim.sh). Prints one JSON line per case: peak live bytes (what
the program holds at once), the peak device memory the allocator used as it
reports it, and as NVML sees the device (used minus the baseline taken after
the context was set up).

MODE: shim (PYTORCH_NO_CUDA_MEMORY_CACHING=1 with LD_PRELOAD=libvpmm.so; run
one case per process, since the pool keeps its pages), native or expandable
(PyTorch's caching allocator, emptied between cases).
"""
import json
import sys

import pynvml
import torch

from vpmm_probe import nvml_handle, pool_stats

MiB, GiB = 1 << 20, 1 << 30
CASES = {
    # 8 x 16 MiB freed, then 4 x 32 MiB
    "8x16_then_4x32": [("+", f"s{i}", 16 * MiB) for i in range(8)]
    + [("-", f"s{i}", 0) for i in range(8)]
    + [("+", f"l{i}", 32 * MiB) for i in range(4)],
    # four 16 MiB, #0 and #2 freed, then 32 MiB
    "holes_then_32": [("+", f"s{i}", 16 * MiB) for i in range(4)]
    + [("-", "s0", 0), ("-", "s2", 0), ("+", "big", 32 * MiB)],
    # +10 GB +1 GB -10 GB +4 GB +11 GB
    "10_1_-10_4_11": [("+", "a", 10 * GiB), ("+", "b", 1 * GiB), ("-", "a", 0),
                      ("+", "c", 4 * GiB), ("+", "d", 11 * GiB)],
}

mode = sys.argv[1]
names = sys.argv[2:] or list(CASES)
dev = torch.device("cuda:0")
torch.empty(1, dtype=torch.uint8, device=dev).fill_(1)  # context, fill kernel loaded
torch.cuda.synchronize()
pynvml.nvmlInit()
nv = nvml_handle(pynvml)


def nv_used():
    return pynvml.nvmlDeviceGetMemoryInfo(nv).used


for name in names:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    base = nv_used()
    held, live, live_peak, nv_peak = {}, 0, 0, 0
    for op, key, size in CASES[name]:
        if op == "+":
            t = torch.empty(size, dtype=torch.uint8, device=dev)
            t.fill_(1)  # touched, as real data would be
            held[key] = t
            live += size
        else:
            live -= held.pop(key).numel()
        torch.cuda.synchronize()
        live_peak = max(live_peak, live)
        nv_peak = max(nv_peak, nv_used() - base)
    out = {"mode": mode, "case": name, "live_peak": live_peak, "nvml_peak": nv_peak}
    if mode == "shim":
        st = pool_stats()
        out["pool_mapped_peak"] = st["mapped_peak"] if st else None
        out["pool_live_peak"] = st["live_peak"] if st else None
        out["pool_defrags"] = st["defrags"] if st else None
        out["page_size"] = st["page_size"] if st else None
    else:
        out["reserved_peak"] = torch.cuda.max_memory_reserved()
    held.clear()
    print(json.dumps(out), flush=True)
