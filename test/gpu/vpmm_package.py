"""vpmm_package.py -- the Python package vpmm against real PyTorch and a
GPU (scripts/gpu-python.sh lays the package out and runs this): enable()
before CUDA makes PyTorch allocate from the pool, stats() and
memory_stats() see those allocations, empty_cache() gives the memory back
(the device's free memory grows by as much), snapshot() covers the mapped
memory, enable() after CUDA started says it is too late, record_history()
gives a training step's snapshot Python frames that
torch.cuda._memory_viz renders (and test/python/viz_check.py finds
drawable), and `python -m vpmm run` serves a program that does not know
vpmm, with and without PyTorch's allocator. Each check runs in a process
of its own; prints "ok"/"FAILED" lines, exits 1 if any failed."""
import json
import os
import subprocess
import sys

TEST_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")

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

HISTORY = r"""
import base64, json, pickle, re, sys
import torch, vpmm
import torch.cuda._memory_viz as viz
sys.path.insert(0, "@TEST_PYTHON@")
from viz_check import viz_pickle, viz_replay
vpmm.enable()
vpmm.record_history(True)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters())


def train_step():
    x = torch.randn(512, 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(3):
    train_step()
torch.cuda.synchronize()
snap = vpmm.snapshot()
out = {}
blocks = [b for g in snap["segments"] for b in g["blocks"] if b["state"] == "active_allocated"]
out["blocks"] = len(blocks)
out["blocks_with_frames"] = sum(1 for b in blocks if b["frames"])
trace = snap["device_traces"][0] if snap["device_traces"] else []
out["events"] = len(trace)
out["actions"] = sorted({e["action"] for e in trace})
out["events_without_frames"] = sum(1 for e in trace if not e["frames"])
step = [e for e in trace if e["action"] == "alloc" and
        any(f["name"] == "train_step" and f["filename"] == "<string>" for f in e["frames"])]
out["allocs_in_train_step"] = len(step)
out["sample_frames"] = step[0]["frames"][:4] if step else []
try:
    viz_replay(snap, 0)
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        vpmm.dump_snapshot(f.name)
        viz_pickle(f.read())
    out["drawable"] = "yes"
except AssertionError as e:
    out["drawable"] = str(e)


def opened(html):
    m = re.search(r'"base64":\s*"([^"]*)"', html)
    return pickle.loads(base64.b64decode(m.group(1))) if m else None


out["trace_plot"] = opened(viz.trace_plot(snap)) == snap
out["segment_plot"] = opened(viz.segment_plot(snap)) == snap
out["segsum"] = "total_reserved" in viz.segsum(snap)
print(json.dumps(out))
""".replace("@TEST_PYTHON@", TEST_PYTHON)

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

rc, out, err = py(HISTORY)
o = json.loads(out) if rc == 0 and out.startswith("{") else None
check(o is not None, "record_history(True), three training steps, snapshot()", out + err[-3000:])
if o:
    print("        %d live blocks, %d with frames; %d events (%s), %d without frames "
          "(threads without the GIL); frames of an alloc: %s"
          % (o["blocks"], o["blocks_with_frames"], o["events"], ", ".join(o["actions"]),
             o["events_without_frames"],
             " < ".join("%s:%s" % (f["name"], f["line"]) for f in o["sample_frames"])))
    check(o["blocks_with_frames"] > 0, "live blocks carry Python frames", o)
    check(o["allocs_in_train_step"] > 0 and
          {"alloc", "free_requested", "free_completed"} <= set(o["actions"]),
          "device_traces: the step's allocations name train_step, frees recorded", o)
    check(o["drawable"] == "yes", "memory_viz can read and draw it (viz_check)", o["drawable"])
    check(o["trace_plot"] and o["segment_plot"] and o["segsum"],
          "torch.cuda._memory_viz: trace_plot and segment_plot embed the snapshot with its "
          "frames, segsum adds it up", o)

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
