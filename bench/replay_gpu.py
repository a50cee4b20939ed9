#!/usr/bin/env python3
"""replay_gpu.py — replays allocation traces on the GPU through one allocator
per process and measures peak device memory used against peak live bytes,
and the time the allocator calls took.

Owns: the GPU side of the workload comparison. Two commands:

  replay_gpu.py run --alloc NAME --trace FILE.csv [--libvpmm PATH] [--max-ops N]
      One replay in this process; prints one line `RESULT {json}` and exits
      0 when it completed, 1 when it did not (the reason in the result: an
      allocation that failed is `failure` "oom" or "error" with `failed_at`,
      the index of its operation; anything else is an `error` alone).
      --max-ops N replays the trace's first N operations only (peak_live is
      then the cut trace's).
  replay_gpu.py matrix --workloads DIR --out FILE.json [--allocs a,b] [--libvpmm PATH]
      One subprocess per (allocator, workload), in turn (cudaMemGetInfo is
      device-wide, so two replays must never overlap), each with its own
      environment; writes every result to FILE.json.

Allocators (NAME):
  cudaMalloc        cudaMalloc/cudaFree per allocation (libcudart via ctypes)
  cuda_pool         cudaMallocAsync/cudaFreeAsync on the default mempool,
                    release threshold UINT64_MAX
  torch_native      PyTorch caching allocator, PYTORCH_CUDA_ALLOC_CONF unset
  torch_expandable  PyTorch, expandable_segments:True
  torch_async       PyTorch, backend:cudaMallocAsync
  vpmm_torch        libvpmm's vpmm_torch_malloc/vpmm_torch_free (ctypes),
                    stream-ordered: the pluggable-allocator entry points
  vpmm_preload      plain cudaMalloc/cudaFree with libvpmm.so in LD_PRELOAD
  vpmm_preload_always  the same with VPMM_REMAP=always: remapping before
                    every growth, the least memory at every moment

Measurements (run):
  peak_used   max over every allocate of the device memory used (NVML's
              count; cudaMemGetInfo's where NVML is missing) minus the same
              taken after context, streams and allocator set-up, before the
              first allocation. Peaks only happen at an allocate, so frees
              are not sampled. NVML, because libvpmm's shim reports its
              reusable bytes as free through cudaMemGetInfo.
  peak_used_rt  the same through cudaMemGetInfo (torch.cuda.mem_get_info for
              the torch allocators): what the program itself sees.
  peak_live   the trace's own peak of requested bytes alive.
  setup_used  what the process itself added to the device's used memory
              before the first allocation (context, streams, allocator
              set-up): NVML's count then minus NVML's count before the
              CUDA context was made (None without NVML). What another
              process must leave free beyond the allocations themselves.
  failure, failed_at, failed_size  for a replay whose allocation failed:
              "oom" when the allocator said out of memory
              (cudaErrorMemoryAllocation, torch's OutOfMemoryError, NULL from
              the pluggable entry point, which logs any other cause on
              stderr), "error" for any other error code; the operation's
              index in the trace and the size asked for.
  call_s      sum of the host time of the allocator calls alone (each call
              timed with perf_counter_ns; the sampling is outside), plus the
              final device synchronisation. Python's call overhead (~0.1-1 us
              a call) is in it for every allocator alike.
  wall_s      the whole loop, sampling included.
  alloc_ns / free_ns  medians of the per-call host times.
  slow_calls / slow_s  the calls over 20 us and their total: where the
              allocator went to the driver (growth, defragmentation).
  shim_active, pool_malloc, passthrough, pool_stats  (libvpmm only) what
              the library reports of itself: a preload run whose pool served
              nothing measured plain CUDA, not libvpmm. fence_free,
              fence_malloc, fence_owed, fence_spared: the synchronous frees
              and mallocs the shim ordered on the legacy stream instead of
              synchronising, the event records those frees cost, and the
              mallocs that found one owed but did not need it.

torch and cupy are imported only by the allocators that need them, so this
file loads (and --help works) on a machine without either. The `dry`
allocator needs no GPU at all: it checks the harness (and bench/pressure.py)
on any machine; see setup_dry_allocator for its test knobs.
"""
import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time

# vpmm_probe: which GPU NVML should read (test/gpu, beside the GPU checks)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "gpu"))
from vpmm_probe import cuda_pci_bus_id, visible_index  # noqa: E402

ALLOCATORS = ["cudaMalloc", "cuda_pool", "torch_native", "torch_expandable",
              "torch_async", "vpmm_torch", "vpmm_preload", "vpmm_preload_always"]
TORCH_CONF = {
    "torch_native": None,
    "torch_expandable": "expandable_segments:True",
    "torch_async": "backend:cudaMallocAsync",
}
VPMM_ALLOCATORS = ("vpmm_torch", "vpmm_preload", "vpmm_preload_always")
PRELOAD_ALLOCATORS = ("vpmm_preload", "vpmm_preload_always")
# Environment of the libvpmm variants (VPMM_* options of the library).
VPMM_ENV = {"vpmm_preload_always": {"VPMM_REMAP": "always"}}
UINT64_MAX = (1 << 64) - 1
SLOW_NS = 20000    # calls slower than this went to the driver (growth, defrag)
CUDA_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4   # cudaMemPoolAttrReleaseThreshold
CUDA_STREAM_NON_BLOCKING = 1
CUDA_ERROR_MEMORY_ALLOCATION = 2          # cudaErrorMemoryAllocation


# ---- the trace ----------------------------------------------------------------

NO_STREAM_ORDER = 0xffffffffffffffff  # vpmm-replay's VPMM_NO_STREAM


def parse_id(s):
    """Pointer or stream: hexadecimal with or without 0x, as vpmm-replay reads."""
    s = s.strip()
    if s == "(nil)":
        return 0
    return int(s, 16)


def load_trace(path, max_ops=0):
    """[(is_alloc, slot, size, stream_value)], number of slots, peak live.
    Slots number the allocations so the loop indexes a list, not a dict.
    max_ops > 0 keeps the first max_ops operations (and their peak)."""
    ops = []
    live = {}       # log pointer -> (slot, size)
    nslots = 0
    cur = peak = 0
    with open(path) as f:
        header = f.readline().strip().split(",")
        if header[:6] != ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]:
            raise ValueError("%s: not an RMM log (header %r)" % (path, header))
        for lineno, line in enumerate(f, 2):
            if max_ops and len(ops) >= max_ops:
                break
            fields = line.rstrip("\n").split(",")
            if len(fields) < 6:
                continue
            act = fields[2].strip().lower()
            ptr, size, stream = parse_id(fields[3]), int(fields[4]), parse_id(fields[5])
            if act == "allocate":
                if size == 0:
                    continue
                live[ptr] = (nslots, size)
                ops.append((True, nslots, size, stream))
                nslots += 1
                cur += size
                peak = max(peak, cur)
            elif act == "free":
                if ptr not in live:
                    continue    # as vpmm-replay: a free of nothing is ignored
                slot, sz = live.pop(ptr)
                ops.append((False, slot, sz, stream))
                cur -= sz
    return ops, nslots, peak


# ---- CUDA runtime through ctypes -----------------------------------------------

def find_cudart():
    env = os.environ.get("VPMM_BENCH_CUDART")
    if env:
        return env
    cands = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands += sorted(glob.glob(os.path.join(home, "lib64", "libcudart.so*")))
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        for loc in (spec.submodule_search_locations if spec else []) or []:
            cands += sorted(glob.glob(os.path.join(loc, "*", "lib", "libcudart.so*")))
    except Exception:
        pass
    for c in cands:
        if os.path.exists(c):
            return c
    return ctypes.util.find_library("cudart")


class Cudart:
    """The few runtime calls the non-torch allocators need."""

    def __init__(self):
        path = find_cudart()
        if not path:
            raise RuntimeError("libcudart not found (set VPMM_BENCH_CUDART)")
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int

        def fn(name, *args):
            f = getattr(lib, name)
            f.restype = I
            f.argtypes = list(args)
            return f

        self.cudaMalloc = fn("cudaMalloc", ctypes.POINTER(P), S)
        self.cudaFree = fn("cudaFree", P)
        self.cudaMallocAsync = fn("cudaMallocAsync", ctypes.POINTER(P), S, P)
        self.cudaFreeAsync = fn("cudaFreeAsync", P, P)
        self.cudaMemGetInfo = fn("cudaMemGetInfo", ctypes.POINTER(S), ctypes.POINTER(S))
        self.cudaDeviceSynchronize = fn("cudaDeviceSynchronize")
        self.cudaSetDevice = fn("cudaSetDevice", I)
        self.cudaStreamCreateWithFlags = fn("cudaStreamCreateWithFlags",
                                            ctypes.POINTER(P), ctypes.c_uint)
        self.cudaDeviceGetDefaultMemPool = fn("cudaDeviceGetDefaultMemPool",
                                              ctypes.POINTER(P), I)
        self.cudaMemPoolSetAttribute = fn("cudaMemPoolSetAttribute", P, I, P)
        self.cudaGetErrorString = lib.cudaGetErrorString
        self.cudaGetErrorString.restype = ctypes.c_char_p
        self.cudaGetErrorString.argtypes = [I]
        self._free = S()
        self._total = S()

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError("%s: %s (%d)" % (what, self.cudaGetErrorString(rc).decode(), rc))

    def init(self):
        self.check(self.cudaSetDevice(0), "cudaSetDevice")
        self.check(self.cudaFree(None), "cudaFree(0)")   # creates the context

    def used(self):
        self.check(self.cudaMemGetInfo(ctypes.byref(self._free), ctypes.byref(self._total)),
                   "cudaMemGetInfo")
        return self._total.value - self._free.value

    def stream(self):
        s = ctypes.c_void_p()
        self.check(self.cudaStreamCreateWithFlags(ctypes.byref(s), CUDA_STREAM_NON_BLOCKING),
                   "cudaStreamCreateWithFlags")
        return s.value or 0


class Nvml:
    """Device memory used, as NVML sees it. libvpmm's shim adds the pool's
    reusable bytes to the free memory cudaMemGetInfo reports (so programs
    that size themselves from it see what they can really get); NVML is not
    hooked, so it measures every allocator the same way."""

    class MemInfo(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self, index=0, bus=None):
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
        if init() != 0:
            raise RuntimeError("nvmlInit failed")
        self.dev = ctypes.c_void_p()
        by_bus = getattr(lib, "nvmlDeviceGetHandleByPciBusId_v2", None)
        if not (bus and by_bus and by_bus(bus.encode(), ctypes.byref(self.dev)) == 0):
            get = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or \
                lib.nvmlDeviceGetHandleByIndex
            if get(ctypes.c_uint(index), ctypes.byref(self.dev)) != 0:
                raise RuntimeError("nvmlDeviceGetHandleByIndex(%d) failed" % index)
        self.fn = lib.nvmlDeviceGetMemoryInfo
        self.fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(Nvml.MemInfo)]
        self.info = Nvml.MemInfo()
        self.ref = ctypes.byref(self.info)

    def used(self):
        if self.fn(self.dev, self.ref) != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return self.info.used


def nvml_device():
    """(index, PCI bus id) of the device CUDA calls 0 here, as NVML knows it:
    by the bus id CUDA gives (vpmm_probe.cuda_pci_bus_id), else by the
    first entry of CUDA_VISIBLE_DEVICES as NVML's index. NVML numbers GPUs
    by PCI bus whatever CUDA_VISIBLE_DEVICES says: read on another GPU, a
    replay measured what ran there (a whole run's peaks read 0 beside a
    second job on GPU 0). VPMM_BENCH_NVML_INDEX overrides."""
    forced = os.environ.get("VPMM_BENCH_NVML_INDEX")
    if forced is not None:
        return int(forced), None
    return visible_index(), cuda_pci_bus_id()


def make_nvml():
    """NVML for the device of the CUDA ordinal 0 (nvml_device); None when
    NVML is missing or unusable."""
    try:
        n = Nvml(*nvml_device())
        n.used()
        return n
    except Exception:
        return None


# ---- allocators ----------------------------------------------------------------
#
# Each builds (alloc(size, stream) -> ptr or 0, free(ptr, size, stream),
# used() -> bytes, sync(), make_stream() -> handle, via, why() -> (failure,
# text) for the last allocation that returned 0, failure "oom" or "error").
# Streams are handles (ints); trace stream 0 is the legacy default stream
# (handle 0). An allocator that raises (torch) is classified by run_one.

def shim_report(libvpmm):
    """What libvpmm says of itself after a replay: whether the shim was
    active, how many allocations its pool served and passed through, the
    pool's stats. {} when the library or the entry points are missing."""
    out = {}
    try:
        lib = ctypes.CDLL(os.path.abspath(libvpmm))   # the loaded copy
    except OSError:
        return out
    try:
        out["shim_active"] = bool(lib.vpmm_shim_active())
    except AttributeError:
        pass
    try:
        f = lib.vpmm_shim_hook_calls
        f.restype = ctypes.c_ulonglong
        f.argtypes = [ctypes.c_char_p]
        for k in ("pool_malloc", "pool_free", "passthrough", "sync_free",
                  "fence_free", "fence_malloc", "fence_owed", "fence_spared"):
            v = f(k.encode())
            if v != (1 << 64) - 1:
                out[k] = v
    except AttributeError:
        pass
    try:
        f = lib.vpmm_shim_stats_json
        f.restype = ctypes.c_long
        f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        buf = ctypes.create_string_buffer(8192)
        if f(0, buf, len(buf)) > 0:
            out["pool_stats"] = json.loads(buf.value.decode())
    except (AttributeError, ValueError):
        pass
    return out


def setup_cudart_allocator(name, libvpmm):
    rt = Cudart()
    rt.init()
    out = ctypes.c_void_p()
    ref = ctypes.byref(out)
    last = [0]      # the error code of the last allocation that failed

    def why():
        rc = last[0]
        if rc is None:      # the pluggable entry point returns NULL alone
            return "oom", "vpmm_torch_malloc returned NULL"
        text = "%s (%d)" % (rt.cudaGetErrorString(rc).decode(), rc)
        return ("oom" if rc == CUDA_ERROR_MEMORY_ALLOCATION else "error"), text

    if name == "cudaMalloc" or name in PRELOAD_ALLOCATORS:
        if name in PRELOAD_ALLOCATORS and "libvpmm" not in os.environ.get("LD_PRELOAD", ""):
            raise RuntimeError("%s needs libvpmm.so in LD_PRELOAD" % name)
        cm, cf = rt.cudaMalloc, rt.cudaFree

        def alloc(size, stream):
            rc = cm(ref, size)
            if rc == 0:
                return out.value
            last[0] = rc
            return 0

        def free(ptr, size, stream):
            return cf(ptr)
    elif name == "cuda_pool":
        pool = ctypes.c_void_p()
        rt.check(rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0),
                 "cudaDeviceGetDefaultMemPool")
        thr = ctypes.c_uint64(UINT64_MAX)
        rt.check(rt.cudaMemPoolSetAttribute(pool, CUDA_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                            ctypes.byref(thr)),
                 "cudaMemPoolSetAttribute(ReleaseThreshold)")
        ma, fa = rt.cudaMallocAsync, rt.cudaFreeAsync

        def alloc(size, stream):
            rc = ma(ref, size, stream)
            if rc == 0:
                return out.value
            last[0] = rc
            return 0

        def free(ptr, size, stream):
            return fa(ptr, stream)
    elif name == "vpmm_torch":
        if not libvpmm or not os.path.exists(libvpmm):
            raise RuntimeError("libvpmm.so not found (%s)" % libvpmm)
        lib = ctypes.CDLL(os.path.abspath(libvpmm))
        try:
            va, vf = lib.vpmm_torch_malloc, lib.vpmm_torch_free
        except AttributeError as e:
            raise RuntimeError("libvpmm.so lacks the pluggable entry points: %s" % e)
        va.restype = ctypes.c_void_p
        va.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        vf.restype = None
        vf.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

        last[0] = None

        def alloc(size, stream):
            return va(size, 0, stream) or 0

        def free(ptr, size, stream):
            vf(ptr, size, 0, stream)
            return 0
    else:
        raise ValueError(name)

    def sync():
        rt.check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    return alloc, free, rt.used, sync, rt.stream, rt.path, why


def setup_torch_allocator(name):
    conf = TORCH_CONF[name]
    cur = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if cur != conf:
        raise RuntimeError("PYTORCH_CUDA_ALLOC_CONF is %r, %s needs %r (matrix sets it)"
                           % (cur, name, conf))
    import torch
    torch.cuda.init()
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    C = torch._C
    raw_alloc = getattr(C, "_cuda_cudaCachingAllocator_raw_alloc", None)
    raw_delete = getattr(C, "_cuda_cudaCachingAllocator_raw_delete", None)
    if raw_alloc is None or raw_delete is None:
        # Public wrappers: slower (a device guard per call), same allocator.
        def alloc(size, stream):
            return torch.cuda.caching_allocator_alloc(size, 0, stream)

        def free(ptr, size, stream):
            torch.cuda.caching_allocator_delete(ptr)
            return 0
    else:
        def alloc(size, stream):
            return raw_alloc(size, stream)

        def free(ptr, size, stream):
            raw_delete(ptr)
            return 0

    streams = []   # keep the Stream objects alive

    def make_stream():
        s = torch.cuda.Stream()
        streams.append(s)
        return s.cuda_stream

    def used():
        f, t = torch.cuda.mem_get_info()
        return t - f

    def why():      # torch raises instead of returning 0
        return "error", "the allocator returned 0 without raising"

    backend = torch.cuda.get_allocator_backend()
    return alloc, free, used, torch.cuda.synchronize, make_stream, \
        "torch %s (%s)" % (torch.__version__, backend), why


def setup_dry_allocator():
    """No GPU: memory is a counter of 2 MiB-rounded live bytes. Only for
    checking the harness, bench/pressure.py and the report on a machine
    without a GPU. Test knobs (environment):
      VPMM_BENCH_DRY_CAPACITY=BYTES  an allocation that would take the
          counter over BYTES fails as out of memory;
      VPMM_BENCH_DRY_FAULT=KIND:N    at the N-th allocation (from 0) the
          process aborts (abort: SIGABRT), hangs (hang), or exits with
          status 3 without a result (exit)."""
    state = {"used": 0, "next": 1 << 40, "calls": 0}
    capacity = int(os.environ.get("VPMM_BENCH_DRY_CAPACITY") or 0)
    fault, _, at = (os.environ.get("VPMM_BENCH_DRY_FAULT") or "").partition(":")
    if fault and fault not in ("abort", "hang", "exit"):
        raise ValueError("VPMM_BENCH_DRY_FAULT: %r is not abort, hang or exit" % fault)
    fault_at = int(at) if fault else -1

    def alloc(size, stream):
        if state["calls"] == fault_at:
            if fault == "abort":
                os.kill(os.getpid(), signal.SIGABRT)
            elif fault == "hang":
                time.sleep(3600)
            sys.stdout.flush()
            os._exit(3)
        state["calls"] += 1
        rounded = (size + (2 << 20) - 1) >> 21 << 21
        if capacity and state["used"] + rounded > capacity:
            return 0
        state["used"] += rounded
        state["next"] += size + 512
        return state["next"]

    def free(ptr, size, stream):
        state["used"] -= (size + (2 << 20) - 1) >> 21 << 21
        return 0

    def why():
        return "oom", "dry capacity of %d bytes" % capacity

    counter = iter(range(1, 1 << 30))
    return alloc, free, lambda: state["used"], lambda: None, \
        lambda: next(counter), "dry (no GPU)", why


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except Exception:
        return None


def run_one(name, trace_path, libvpmm, max_ops=0):
    for var, want in VPMM_ENV.get(name, {}).items():
        if os.environ.get(var) != want:
            raise RuntimeError("%s is %r, %s needs %r (matrix sets it)"
                               % (var, os.environ.get(var), name, want))
    ops, nslots, peak_live = load_trace(trace_path, max_ops)
    # NVML before the context: what the process itself adds is the
    # difference (setup_used), the figure another process must leave free.
    nvml = make_nvml() if name != "dry" else None
    pre_context = nvml.used() if nvml else None
    if name == "dry":
        alloc, free, used, sync, make_stream, via, why = setup_dry_allocator()
    elif name in TORCH_CONF:
        alloc, free, used, sync, make_stream, via, why = setup_torch_allocator(name)
    else:
        alloc, free, used, sync, make_stream, via, why = \
            setup_cudart_allocator(name, libvpmm)
    # Real streams for the trace's stream values, made before the baseline.
    # No stream order (VPMM_TRACE's 0xffffffffffffffff, a call the pool took
    # without one) replays on the legacy stream: the call itself for the
    # allocators that take no stream (cudaMalloc, the preload), an order on
    # the legacy stream, not a synchronisation, for the stream-ordered ones.
    smap = {0: 0, NO_STREAM_ORDER: 0}
    for _, _, _, s in ops:
        if s not in smap:
            smap[s] = make_stream()
    ops = [(a, slot, size, smap[s]) for a, slot, size, s in ops]
    used_rt = used
    if nvml:
        used = nvml.used
    sync()
    base = used()
    base_rt = used_rt()
    ptrs = [0] * nslots
    peak = peak_rt = 0
    t_alloc, t_free = [], []
    clock = time.perf_counter_ns
    error = failure = failed_at = failed_size = None
    w0 = clock()
    for is_alloc, slot, size, stream in ops:
        if is_alloc:
            t0 = clock()
            try:
                p = alloc(size, stream)
            except Exception as e:     # torch raises on OOM
                p, error = 0, "%s: %s" % (type(e).__name__, str(e)[:200])
                failure = "oom" if type(e).__name__ == "OutOfMemoryError" or \
                    "out of memory" in str(e).lower() else "error"
            t1 = clock()
            if not p:
                failed_at, failed_size = len(t_alloc) + len(t_free), size
                if failure is None:
                    failure, text = why()
                    error = "allocation of %d bytes failed at op %d: %s" % (
                        size, failed_at, text)
                break
            ptrs[slot] = p
            t_alloc.append(t1 - t0)
            u = used() - base
            if u > peak:
                peak = u
            u = used_rt() - base_rt
            if u > peak_rt:
                peak_rt = u
        else:
            t0 = clock()
            rc = free(ptrs[slot], size, stream)
            t1 = clock()
            if rc:
                error = "free failed (%d) at op %d" % (rc, len(t_alloc) + len(t_free))
                break
            ptrs[slot] = 0
            t_free.append(t1 - t0)
    t0 = clock()
    sync_error = None
    try:
        sync()
    except Exception as e:
        sync_error = "%s: %s" % (type(e).__name__, e)
    t_sync = clock() - t0
    wall = clock() - w0
    final = used() - base
    # Live allocations left by a failed or cut replay: give them back so the
    # process exits cleanly (best effort).
    for slot, p in enumerate(ptrs):
        if p:
            try:
                free(p, 0, 0)
            except Exception:
                pass
    if sync_error and error is None:
        error = "final synchronisation: " + sync_error
    slow = [t for t in t_alloc + t_free if t > SLOW_NS]
    res = {
        "alloc": name, "trace": os.path.basename(trace_path).rsplit(".", 1)[0],
        "ok": error is None, "error": error, "via": via,
        "failure": failure, "failed_at": failed_at, "failed_size": failed_size,
        "sync_error": sync_error,
        "ops": len(ops), "max_ops": max_ops, "done_ops": len(t_alloc) + len(t_free),
        "peak_live": peak_live, "peak_used": peak,
        "ratio": (peak / peak_live) if peak_live else None,
        "measured_by": "nvml" if nvml else ("dry" if name == "dry" else "cudaMemGetInfo"),
        "peak_used_rt": peak_rt,
        "ratio_rt": (peak_rt / peak_live) if peak_live else None,
        "baseline_used": base, "final_used": final,
        "pre_context_used": pre_context,
        "setup_used": (base - pre_context) if pre_context is not None else
                      (0 if name == "dry" else None),
        "call_s": (sum(t_alloc) + sum(t_free) + t_sync) / 1e9,
        "wall_s": wall / 1e9,
        "alloc_ns": statistics.median(t_alloc) if t_alloc else None,
        "free_ns": statistics.median(t_free) if t_free else None,
        "streams": len({op[3] for op in ops}),
        "slow_calls": len(slow), "slow_s": sum(slow) / 1e9,
    }
    if name in VPMM_ALLOCATORS:
        res.update(shim_report(libvpmm if name not in PRELOAD_ALLOCATORS
                               else os.environ.get("LD_PRELOAD", "").split(":")[0]))
    return res


def cmd_run(args):
    try:
        res = run_one(args.alloc, args.trace, args.libvpmm, args.max_ops)
    except Exception as e:
        res = {"alloc": args.alloc,
               "trace": os.path.basename(args.trace).rsplit(".", 1)[0],
               "ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    print("RESULT " + json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


def child_env(name, libvpmm):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    env.pop("LD_PRELOAD", None)
    for k in list(env):
        if k.startswith("VPMM_") and k not in ("VPMM_SOCKET", "VPMM_LOG"):
            env.pop(k)
    env.update(VPMM_ENV.get(name, {}))
    if name in TORCH_CONF and TORCH_CONF[name]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = TORCH_CONF[name]
    if name in PRELOAD_ALLOCATORS:
        env["LD_PRELOAD"] = os.path.abspath(libvpmm)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cmd_matrix(args):
    with open(os.path.join(args.workloads, "index.json")) as f:
        index = json.load(f)
    names = args.allocs.split(",") if args.allocs else list(ALLOCATORS)
    have_vpmm = bool(args.libvpmm) and os.path.exists(args.libvpmm)
    workloads = [w for w in index if not args.only or w in args.only.split(",")]
    results = []
    log = open(args.log, "a") if args.log else None
    start = time.time()

    def save():
        # Rewritten after every replay: a run cut short keeps what it got.
        with open(args.out + ".tmp", "w") as f:
            json.dump({"device": device, "date": time.strftime("%Y-%m-%d"),
                       "index": index, "results": results}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    device = device_name()
    for w in workloads:
        trace = os.path.join(args.workloads, index[w]["file"])
        for name in names:
            if args.deadline and time.time() - start > args.deadline:
                results.append({"alloc": name, "trace": w, "ok": False, "skipped": True,
                                "error": "not run: past the %ds deadline" % args.deadline})
                print("%-22s %-17s not run: past the deadline" % (w, name), flush=True)
                continue
            if name in VPMM_ALLOCATORS and not have_vpmm:
                res = {"alloc": name, "trace": w, "ok": False, "skipped": True,
                       "error": "libvpmm.so not built"}
                results.append(res)
                print("%-22s %-17s skipped: libvpmm.so not built" % (w, name), flush=True)
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "run", "--alloc", name,
                   "--trace", trace]
            if args.libvpmm:
                cmd += ["--libvpmm", args.libvpmm]
            t0 = time.time()
            try:
                p = subprocess.run(cmd, env=child_env(name, args.libvpmm or ""),
                                   capture_output=True, text=True, timeout=args.timeout)
                out, err, rc = p.stdout, p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                err = "timed out after %ds" % args.timeout
                rc = -1
            res = None
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
            if res is None:
                res = {"alloc": name, "trace": w, "ok": False,
                       "error": "no result (rc %s): %s" % (rc, err.strip()[-400:])}
            res["process_s"] = time.time() - t0
            results.append(res)
            if log:
                log.write("== %s %s rc=%s\n%s\n%s\n" % (w, name, rc, out, err))
                log.flush()
            if res.get("ok"):
                extra = ""
                if name in VPMM_ALLOCATORS:
                    extra = "  pool served %s, passed through %s" % (
                        res.get("pool_malloc", "?"), res.get("passthrough", "?"))
                print("%-22s %-17s peak used/live %6.3f  calls %8.3f s (%d > 20 us: %.3f s)  "
                      "alloc %7.0f ns  free %7.0f ns  (%.1f s)%s"
                      % (w, name, res["ratio"], res["call_s"], res["slow_calls"],
                         res["slow_s"], res["alloc_ns"], res["free_ns"],
                         res["process_s"], extra), flush=True)
            else:
                print("%-22s %-17s FAILED: %s" % (w, name, res.get("error")), flush=True)
            save()
    save()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one replay in this process")
    r.add_argument("--alloc", required=True, choices=ALLOCATORS + ["dry"])
    r.add_argument("--trace", required=True)
    r.add_argument("--libvpmm")
    r.add_argument("--max-ops", type=int, default=0,
                   help="replay only the trace's first N operations")
    m = sub.add_parser("matrix", help="every (allocator, workload) in its own process")
    m.add_argument("--workloads", required=True, help="directory written by workloads.py")
    m.add_argument("--out", required=True, help="results JSON")
    m.add_argument("--allocs", help="comma-separated allocator names (default: all)")
    m.add_argument("--only", help="comma-separated workload names")
    m.add_argument("--libvpmm")
    m.add_argument("--timeout", type=int, default=120, help="seconds per replay")
    m.add_argument("--log", help="append every child's output here")
    m.add_argument("--deadline", type=int, default=0,
                   help="seconds after which the remaining replays are not started")
    args = ap.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
