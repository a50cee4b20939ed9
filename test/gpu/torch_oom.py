"""torch_oom.py -- PyTorch's CUDAPluggableAllocator over libvpmm.so (VPMM_LIB,
no preload) refusing a request the device cannot hold, for the shim's GPU
check (scripts/gpu-shim.sh, step torch-oom).

Four tensors of 1 GiB, two of them freed, then one request of the device's
free memory plus 3 GiB, which neither the device nor the pool's reusable
memory can serve. Checked: the refusal reaches Python as an exception (not
a tensor at address 0) whose text says what the pool held (2 GiB live, its
reusable bytes and where they lie) and what the device had free (within
half a GiB of what PyTorch read before the request); the two
tensors kept still hold their values; the pool serves 1 GiB afterwards.
Prints the exception's text and one JSON line; exits 0 when every check
passed, 1 otherwise.
"""
import json
import os
import re
import sys

import torch

GiB = 1 << 30
alloc = torch.cuda.memory.CUDAPluggableAllocator(
    os.environ["VPMM_LIB"], "vpmm_torch_malloc", "vpmm_torch_free")
torch.cuda.memory.change_current_allocator(alloc)

failed = []


def check(ok, what):
    if not ok:
        failed.append(what)
        print(f"torch_oom.py: check failed: {what}", file=sys.stderr)


t = [torch.full((GiB // 4,), float(i), dtype=torch.float32, device="cuda")
     for i in range(4)]
kept = [t[0], t[3]]
del t
torch.cuda.synchronize()
dev_free, dev_total = torch.cuda.mem_get_info()
ask = dev_free + 3 * GiB
text = ""
try:
    x = torch.empty(ask, dtype=torch.uint8, device="cuda")
    check(False, f"an allocation of {ask} bytes was served at {x.data_ptr():#x}")
except Exception as e:  # PyTorch raises the allocator's error as it sees fit
    text = str(e)
print("thrown:", text)
check("vpmm: CUDA out of memory" in text, "the text says out of memory")
check(f"tried to allocate {ask} bytes on device 0" in text, "the text gives the request")
m = re.search(r"the pool holds ([\d.]+ \w+) live and ([\d.]+ \w+) reusable", text)
check(m is not None and m.group(1) == "2.00 GiB", "the pool held the 2 GiB kept, live")
# The two freed tensors: 2 GiB reusable, in handles of their own (1 GiB
# tensors are whole pages); giving them back could not have served 3 GiB
# beyond the device, so the pool keeps them.
check(m is not None and m.group(2) == "2.00 GiB", "the 2 GiB freed, reusable")
check("(2.00 GiB in wholly free handles, 0 B stranded" in text,
      "the freed tensors' handles are wholly free")
d = re.search(r"the device has ([\d.]+) GiB free of ([\d.]+) GiB", text)
check(d is not None and abs(float(d.group(1)) * GiB - dev_free) <= 0.5 * GiB
      and abs(float(d.group(2)) * GiB - dev_total) <= 0.01 * GiB,
      "the text gives the device's free memory, as PyTorch read it before")
torch.cuda.synchronize()
check(kept[0].eq(0).all().item() and kept[1].eq(3).all().item(),
      "the tensors kept hold their values")
again = torch.ones(GiB // 4, dtype=torch.float32, device="cuda")
check(again.sum().item() == GiB // 4, "the pool serves 1 GiB after the refusal")
print(json.dumps({"asked": ask, "device_free": dev_free, "device_total": dev_total,
                  "reusable": m.group(2) if m else None, "failed": failed}))
sys.exit(1 if failed else 0)
