"""address_torch.py -- PyTorch's backend:cudaMallocAsync, whose memory_stats
read the device's default memory pool (used and reserved bytes, their
peaks; reset_peak_memory_stats resets them, empty_cache trims the pool).
Under LD_PRELOAD=libvpmm.so the pool serves those allocations, and the
default pool's attributes must count them (scripts/gpu-address.sh, part
address of scripts/gpu-check.sh). EXPECT_POOL=1: the pool must have served.
Prints PASS/FAIL lines; exit 0 when all passed."""
import os
import sys

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
import torch  # noqa: E402

from vpmm_probe import pool_stats  # noqa: E402

MiB = 1 << 20
expect_pool = os.environ.get("EXPECT_POOL") == "1"
failed = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (f" ({detail})" if detail else ""))
    if not ok:
        failed.append(name)


def stats():
    s = torch.cuda.memory_stats()
    return (s.get("allocated_bytes.all.current", 0), s.get("reserved_bytes.all.current", 0),
            s.get("allocated_bytes.all.peak", 0))


check("backend is cudaMallocAsync", torch.cuda.get_allocator_backend() == "cudaMallocAsync",
      torch.cuda.get_allocator_backend())
x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
x.fill_(7)
y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
y.fill_(9)
torch.cuda.synchronize()
alloc, res, peak = stats()
check("memory_stats: allocated counts the tensors", alloc >= 320 * MiB, f"allocated {alloc}")
check("memory_stats: reserved covers allocated", res >= alloc, f"reserved {res}")
check("memory_allocated() agrees", torch.cuda.memory_allocated() == alloc)
if expect_pool:
    ps = pool_stats()
    check("the pool served the tensors", ps is not None and ps["live"] >= 320 * MiB,
          f"pool live {ps and ps['live']}")
del y
torch.cuda.synchronize()
alloc2, _, peak2 = stats()
check("a freed tensor leaves allocated", alloc2 <= alloc - 64 * MiB, f"{alloc} -> {alloc2}")
check("the peak stays", peak2 >= alloc, f"peak {peak2}")
torch.cuda.reset_peak_memory_stats()
_, _, peak3 = stats()
check("reset_peak_memory_stats: peak back to current", alloc2 <= peak3 < alloc, f"peak {peak3}")
del x
torch.cuda.synchronize()
torch.cuda.empty_cache()
alloc4, res4, _ = stats()
check("empty_cache: nothing allocated, little reserved", alloc4 == 0 and res4 < 64 * MiB,
      f"allocated {alloc4} reserved {res4}")
z = torch.ones(32 * MiB, device="cuda")
check("allocating again works", float(z.sum()) == 32 * MiB)
sys.exit(1 if failed else 0)
