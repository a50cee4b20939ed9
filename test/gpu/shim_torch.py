"""shim_torch.py MODE [STEPS] -- a small transformer trained with random
weights and data (fixed seed, deterministic kernels), for the shim's GPU check
(scripts/gpu-shim.sh). Prints one JSON line: the loss of every step, the
median step time and peak memory as the mode can see it.

MODE says how memory is allocated; the environment must match it:
  native      PyTorch's caching allocator
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  nocache     PYTORCH_NO_CUDA_MEMORY_CACHING=1 (cudaMalloc/cudaFree per tensor)
  shim        nocache, with LD_PRELOAD=libvpmm.so
  shim-timed  shim, with a clock around the shim's cudaMalloc and cudaFree
              (TIMED_LIB preloaded ahead of libvpmm.so)
  pluggable   CUDAPluggableAllocator over libvpmm.so (VPMM_LIB), no preload
  pluggable-async  CUDAPluggableAllocator over cudaMallocAsync (ASYNC_LIB)
  pluggable-cache  CUDAPluggableAllocator over an exact-size cache on
              cudaMalloc (ASYNC_LIB): what the pluggable interface costs by
              itself, a hit being a hash lookup
  pluggable-timed  pluggable, through a wrapper that times each call
              (TIMED_LIB, test/gpu/torch_timed.c): the step's time inside
              the pool, per step
  pluggable-cache-timed  pluggable-cache through the same wrapper: the
              time an allocator that costs least spends in the same calls
  pluggable-native  CUDAPluggableAllocator over PyTorch's own caching
              allocator (NATIVE_LIB, test/gpu/torch_native.cpp): native
              with the interface's cost added, as the pool has it
  native-timed  pluggable-native through the same wrapper: native's own
              time in the same calls, against which the pool's counts

Modes over libvpmm also report the pool's counters over the timed steps
(pool_per_step: defragmentations, driver calls, cache hits ... per step).

nvml_peak: device memory used at its highest during the run, above what was
used once the context existed (sampled each millisecond, so a peak shorter
than that may be missed); it includes cuBLAS workspaces and the kernels'
modules, the same for every mode.
"""
import ctypes
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

from vpmm_probe import NvmlPeak  # noqa: E402
from vpmm_probe import hook_calls  # noqa: E402
from vpmm_probe import pool_stats as probe_stats  # noqa: E402

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300


def pool_stats():
    """libvpmm.so's stats of device 0: the preloaded library's, or the one
    the pluggable modes load by path."""
    return probe_stats(os.environ["VPMM_LIB"] if mode in ("pluggable", "pluggable-timed")
                       else None)


if mode == "pluggable":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["VPMM_LIB"], "vpmm_torch_malloc", "vpmm_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode == "pluggable-async":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["ASYNC_LIB"], "async_malloc", "async_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode == "pluggable-timed":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["TIMED_LIB"], "timed_malloc", "timed_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode == "pluggable-cache":
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["ASYNC_LIB"], "cache_malloc", "cache_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode == "pluggable-cache-timed":
    os.environ.update(TIMED_TARGET=os.environ["ASYNC_LIB"], TIMED_MALLOC="cache_malloc",
                      TIMED_FREE="cache_free")
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["TIMED_LIB"], "timed_malloc", "timed_free")
    torch.cuda.memory.change_current_allocator(alloc)
elif mode in ("pluggable-native", "native-timed"):
    # native's allocator is kept (and initialised) before the swap, after
    # which c10 no longer hands it out
    if ctypes.CDLL(os.environ["NATIVE_LIB"], mode=ctypes.RTLD_GLOBAL).native_capture():
        sys.exit("native_capture failed")
    lib, m, f = os.environ["NATIVE_LIB"], "native_malloc", "native_free"
    if mode == "native-timed":
        os.environ.update(TIMED_TARGET=lib, TIMED_MALLOC=m, TIMED_FREE=f)
        lib, m, f = os.environ["TIMED_LIB"], "timed_malloc", "timed_free"
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, m, f)
    torch.cuda.memory.change_current_allocator(alloc)


torch.empty(1, device="cuda:0").fill_(1)  # context and first module load
torch.cuda.synchronize()
nvml = NvmlPeak()

torch.manual_seed(0)
torch.use_deterministic_algorithms(True, warn_only=True)
# attention as plain matrix products: deterministic, unlike the fused kernels
torch.backends.cuda.enable_flash_sdp(False)
torch.backends.cuda.enable_mem_efficient_sdp(False)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0")

VOCAB, D, HEADS, SEQ = 4096, 512, 8, 256
# STEP_LAYERS and STEP_BATCH make a deeper model: each layer adds some 30
# mallocs a step, so 140 layers or more make a step of over 4 096
LAYERS = int(os.environ.get("STEP_LAYERS", "6"))
BATCH = int(os.environ.get("STEP_BATCH", "16"))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(
            D, HEADS, 4 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(SEQ, device=x.device)
        h = self.emb(x) + self.pos
        return self.head(self.body(h, mask=mask, is_causal=True))


model = Model().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator(device="cpu").manual_seed(1)
data = torch.randint(0, VOCAB, (64, BATCH, SEQ + 1), generator=gen)

timed = None
if mode in ("pluggable-timed", "pluggable-cache-timed", "native-timed", "shim-timed"):
    timed = ctypes.CDLL(os.environ["TIMED_LIB"]).timed_read
    timed.argtypes = [ctypes.POINTER(ctypes.c_uint64 * 4)]


def timed_now():
    v = (ctypes.c_uint64 * 4)()
    timed(ctypes.byref(v))
    return list(v)


WARMUP = 10
# the shim's hooks and counters a preloaded run reports per step
HOOKS = ("cudaMalloc", "cudaFree", "fence_free", "fence_malloc", "sync_free", "passthrough",
         "cuPointerGetAttribute", "cuPointerGetAttributes", "cuMemGetAddressRange_v2",
         "cudaMemGetInfo", "cuMemGetInfo_v2", "cuStreamCreate", "cuMemAlloc_v2", "cuMemFree_v2",
         "proc_wrapped", "dlsym_wrapped")


def hooks_now():
    """The preloaded shim's counters (an empty dict without the preload)."""
    if not mode.startswith("shim"):
        return {}
    return {h: n for h in HOOKS if (n := hook_calls(h)) is not None}


hooks0 = {}
losses, times, enqueue, inside = [], [], [], []
st0 = None
for step in range(steps):
    batch = data[step % 64].to(dev)
    torch.cuda.synchronize()
    if step == WARMUP:
        st0 = pool_stats()
        hooks0 = hooks_now()
    c0 = timed_now() if timed else None
    t0 = time.perf_counter()
    logits = model(batch[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    enqueue.append(time.perf_counter() - t0)  # the host's share, before the wait
    losses.append(loss.item())  # synchronises
    times.append(time.perf_counter() - t0)
    if timed:
        c1 = timed_now()
        inside.append([b - a for a, b in zip(c0, c1)])

out = {
    "nvml_peak": nvml.done(),
    "mode": mode,
    "steps": steps,
    "losses": losses,
    "step_ms": statistics.median(times[WARMUP:]) * 1e3,
    "enqueue_ms": statistics.median(enqueue[WARMUP:]) * 1e3,
    "card": torch.cuda.get_device_name(0),
    "layers": LAYERS,
    "batch": BATCH,
}
if mode in ("native", "expandable", "nocache", "shim", "shim-timed"):
    out["max_allocated"] = torch.cuda.max_memory_allocated()
    out["max_reserved"] = torch.cuda.max_memory_reserved()
st = pool_stats()
if st:
    out["pool_mapped_peak"] = st["mapped_peak"]
    out["pool_live_peak"] = st["live_peak"]
    out["pool_mallocs"] = st["mallocs"]
    out["pool_defrags"] = st["defrags"]
    out["pool_handles_remapped"] = st.get("handles_remapped")
    out["pool_handles_created"] = st.get("handles_created")
    if st0 and steps > WARMUP:
        n = steps - WARMUP
        out["pool_per_step"] = {k: (st[k] - st0[k]) / n for k in (
            "mallocs", "frees", "front_hits", "defrags", "handles_created", "handles_remapped",
            "zombies_reclaimed", "events_recorded", "stream_waits", "driver_calls")
            if k in st and k in st0}
if hooks0 and steps > WARMUP:
    hooks1 = hooks_now()
    out["hooks_per_step"] = {h: round((hooks1[h] - hooks0[h]) / (steps - WARMUP), 2)
                             for h in hooks0 if hooks1.get(h, 0) != hooks0[h]}
if inside[WARMUP:]:
    per = inside[WARMUP:]
    out["inside_ms"] = statistics.median((x[1] + x[3]) / 1e6 for x in per)
    out["inside_malloc_ns"] = statistics.median(x[1] / max(x[0], 1) for x in per)
    out["inside_free_ns"] = statistics.median(x[3] / max(x[2], 1) for x in per)
    out["inside_max_step_ms"] = max((x[1] + x[3]) / 1e6 for x in per)
    out["calls_per_step"] = statistics.median(x[0] + x[2] for x in per)
    # whole run (warm-up included): calls and ms per power of two of ns
    h = (ctypes.c_uint64 * 96)()
    ctypes.CDLL(os.environ["TIMED_LIB"]).timed_histogram(h)
    out["histogram"] = {w: {"%dns" % (1 << b): [h[(i * 24 + b) * 2], round(h[(i * 24 + b) * 2 + 1] / 1e6, 3)]
                            for b in range(24) if h[(i * 24 + b) * 2]}
                        for i, w in enumerate(("malloc", "free"))}
print(json.dumps(out))
