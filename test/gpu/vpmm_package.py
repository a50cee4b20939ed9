"""vpmm_package.py -- the Python package vpmm against real PyTorch and a
GPU (scripts/gpu-python.sh lays the package out and runs this): enable()
before CUDA makes PyTorch allocate from the pool, stats() and
memory_stats() see those allocations, empty_cache() gives the memory back
(the device's free memory grows by as much), snapshot() covers the mapped
memory, enable() after CUDA started
says it is too late, and `python -m vpmm run` serves a program that does
not know vpmm, with and without PyTorch's allocator. Each check runs in a
process of its own; prints "ok"/"FAILED" lines, exits 1 if any failed."""
import json
import subprocess
import sys

MIB = 1 << 20

ENABLE = r"""
import json, torch, vpmm
path = vpmm.enable()
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
x.fill_(1)
s = vpmm.stats()
m = vpmm.memory_stats()
snap = vpmm.snapshot()
seg_total = sum(g["total_size"] for g in snap["segments"])
del x
torch.cuda.synchronize()
free_before = torch.cuda.mem_get_info()[0]
released = vpmm.empty_cache()
free_after = torch.cuda.mem_get_info()[0]
print(json.dumps({"path": path, "stats": s, "memory_stats": m, "released": released,
                  "seg_total": seg_total,
                  "freed": free_after - free_before, "after": vpmm.stats()}))
"""

TOO_LATE = r"""
import torch, vpmm
torch.ones(1, device="cuda")
try:
    vpmm.enable()
    print("enabled")
except vpmm.VpmmError as e:
    print("refused: %s" % e)
"""

RUN_CHILD = r"""
import json, torch
x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
import vpmm
print(json.dumps({"enabled": vpmm.enabled(), "mallocs": vpmm.stats().get("mallocs", 0)}))
"""

failed = False


def check(cond, what, detail=""):
    global failed
    print("%s  %s%s" % ("ok    " if cond else "FAILED", what, (": %s" % detail) if not cond else ""))
    failed |= not cond


def py(code, *prefix, env=None):
    import os
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(list(prefix) + [sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, env=e, timeout=300)
    return p.returncode, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "", p.stderr


rc, out, err = py(ENABLE)
try:
    o = json.loads(out)
except ValueError:
    o = None
check(rc == 0 and o is not None, "enable(), a 256 MiB tensor, empty_cache()", err[-2000:])
if o:
    s, m = o["stats"], o["memory_stats"]
    check(s.get("mallocs", 0) >= 1 and s.get("live", 0) >= 256 * MIB,
          "the tensor came from the pool", s)
    check(m["allocated_bytes.all.current"] == s["live"] and
          m["reserved_bytes.all.current"] == s["mapped"], "memory_stats() mirrors stats()", m)
    check(o["released"] >= 256 * MIB and o["after"]["mapped"] < s["mapped"],
          "empty_cache() released the freed tensor's memory", o)
    check(o["freed"] >= 200 * MIB, "the device's free memory grew by it (cudaMemGetInfo)", o)
    check(o["seg_total"] == s["mapped"], "snapshot()'s segments sum to mapped", o)

rc, out, err = py(TOO_LATE)
check(rc == 0 and out.startswith("refused: too late"), "enable() after CUDA started: too late",
      out + err[-1000:])

rc, out, err = py(RUN_CHILD, sys.executable, "-m", "vpmm", "run", "--")
o = json.loads(out) if rc == 0 and out.startswith("{") else None
check(o is not None and o["enabled"] and o["mallocs"] >= 1,
      "python -m vpmm run: PyTorch's allocator installed at import, the pool serves", out + err[-2000:])

rc, out, err = py(RUN_CHILD, sys.executable, "-m", "vpmm", "run", "--no-torch", "--",
                  env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
o = json.loads(out) if rc == 0 and out.startswith("{") else None
check(o is not None and o["enabled"] is None and o["mallocs"] >= 1,
      "python -m vpmm run --no-torch: the preload serves PyTorch's cudaMalloc", out + err[-2000:])

sys.exit(1 if failed else 0)
