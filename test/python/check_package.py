"""check_package.py -- the vpmm package as pip installed it into a fresh
virtual environment (check_package.sh makes it and runs this file with its
python), against the stand-in libcuda.so.1 of the shim suite and a stand-in
torch (fake_torch/): no GPU, no real PyTorch.

    python check_package.py VERSION FAKE_CUDA_DIR STANDIN_TORCH_DIR

Each scenario runs in a process of its own, in the environment it needs
(LD_LIBRARY_PATH must be set before a process starts). Prints one line per
scenario; exits 1 at the first failed check, naming it."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

from viz_check import viz_pickle, viz_replay

VERSION, FAKE_DIR, TORCH_DIR = sys.argv[1:4] if len(sys.argv) >= 4 else (None,) * 3
MIB = 1 << 20


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def base_env(**extra):
    """The environment of a scenario: nothing of the caller's preload or
    library path, the socket off (no files left behind)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "VPMM_LIBRARY")
           and not k.startswith("VPMM_")}
    env["VPMM_SOCKET"] = "off"
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def run(args, env, expect=0):
    p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    if expect is not None and p.returncode != expect:
        raise AssertionError("%s: exit %d, expected %d\nstdout: %s\nstderr: %s"
                             % (" ".join(args), p.returncode, expect, p.stdout, p.stderr))
    return p


def scenario(name, **env):
    out = run([sys.executable, __file__, VERSION, FAKE_DIR, TORCH_DIR, name],
              base_env(**env)).stdout.rstrip()
    if out:
        print(out)  # what the scenario reports: skipped parts, figures
    print("ok: %s" % name)


# ---- scenarios, each in its own process -----------------------------------------------

def s_installed():
    import vpmm
    site = os.path.realpath(os.path.join(sys.prefix, "lib"))
    check(os.path.realpath(vpmm.__file__).startswith(site),
          "vpmm imported from %s, not from the venv" % vpmm.__file__)
    check(vpmm.__version__ == VERSION, "vpmm.__version__ %s" % vpmm.__version__)
    lib = vpmm.library_path()
    check(lib == os.path.join(os.path.dirname(os.path.abspath(vpmm.__file__)), "libvpmm.so"),
          "library_path() %s is not the bundled one" % lib)
    check(vpmm.library_version() == VERSION, "library_version() %s" % vpmm.library_version())
    for tool in ("vpmm-dump", "vpmm-replay"):
        exe = os.path.join(os.path.dirname(sys.executable), tool)
        out = run([exe, "--version"], os.environ).stdout
        check(out.startswith("%s %s" % (tool, VERSION)), "%s --version: %s" % (tool, out))
    # nothing allocated: no pool, and nothing to give back
    check(vpmm.stats() == {} and vpmm.memory_stats() == {}, "stats before any allocation")
    check(vpmm.empty_cache() == 0 and vpmm.layout() is None, "empty_cache/layout without a pool")
    check(vpmm.active() is False, "active() with no CUDA driver here")
    try:
        vpmm.empty_cache(keep=-1)
        check(False, "empty_cache(keep=-1) accepted")
    except ValueError:
        pass


def s_no_torch():
    import vpmm
    sys.modules["torch"] = None  # import torch now fails, as without PyTorch
    try:
        vpmm.enable()
    except vpmm.VpmmError as e:
        check("torch cannot be imported" in str(e) and "python -m vpmm run" in str(e),
              "enable() without torch says: %s" % e)
        check(isinstance(e.__cause__, ImportError), "the ImportError is not chained")
        return
    check(False, "enable() without torch did not raise")


def s_enable_and_stats():
    import torch
    import vpmm
    mem = torch.cuda.memory
    path = vpmm.enable()
    check(path == vpmm.library_path() and mem.current is not None, "enable() installed nothing")
    check(mem.current.path == path and mem.current.names == ("vpmm_torch_malloc", "vpmm_torch_free"),
          "the allocator PyTorch got: %r %r" % (mem.current.path, mem.current.names))
    check(vpmm.enable() == path and mem.changes == 1 and vpmm.enabled() == path,
          "a second enable() changed the allocator again")
    # PyTorch allocating through it, once it started CUDA (cuInit): the pool
    # serves, and vpmm reads the same pool
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0) == 0, "cuInit")
    p = mem.current.malloc(3 * MIB, 0, None)
    check(p, "vpmm_torch_malloc returned NULL")
    s = vpmm.stats()
    check(s["mallocs"] == 1 and s["live"] >= 3 * MIB, "stats after a malloc: %r" % s)
    m = vpmm.memory_stats()
    check(m["allocated_bytes.all.current"] == s["live"] and
          m["allocated_bytes.all.peak"] == s["live_peak"] and
          m["reserved_bytes.all.current"] == s["mapped"] >= s["live"] and
          m["allocation.all.current"] == 1 and m["num_ooms"] == 0,
          "memory_stats %r against stats %r" % (m, s))
    check(vpmm.layout(0) and "[" in vpmm.layout(0), "layout %r" % vpmm.layout(0))
    mem.current.free(p, 3 * MIB, 0, None)
    s = vpmm.stats()
    check(s["frees"] == 1 and s["live"] == 0 and s["reusable"] > 0, "stats after free: %r" % s)
    check(vpmm.memory_stats()["allocation.all.current"] == 0, "live allocations after free")
    # without waiting, the free's queued work has not completed here (the
    # stand-in driver completes work only when synchronised): it stays
    check(vpmm.empty_cache(wait=False) == 0 and vpmm.stats()["mapped"] > 0,
          "empty_cache(wait=False) released memory whose work is queued")
    released = vpmm.empty_cache()
    s = vpmm.stats()
    check(released > 0 and s["mapped"] == 0 and s["pages_released"] > 0,
          "empty_cache() released %d, stats %r" % (released, s))
    check(vpmm.memory_stats()["reserved_bytes.all.current"] == 0, "reserved after empty_cache")
    try:
        vpmm.snapshot()
        check(False, "snapshot() with VPMM_SOCKET=off did not raise")
    except vpmm.VpmmError as e:
        check("VPMM_SOCKET=off" in str(e), "snapshot() without a socket says: %s" % e)


def s_snapshot():
    import pickle
    import torch
    import vpmm
    mem = torch.cuda.memory
    vpmm.enable()
    check(ctypes.CDLL("libcuda.so.1").cuInit(0) == 0, "cuInit")
    a, b, c = (mem.current.malloc(n * MIB, 0, None) for n in (3, 1, 2))
    check(a and b and c, "mallocs")
    mem.current.free(b, MIB, 0, None)
    s = vpmm.stats()
    snap = vpmm.snapshot()
    segs = snap["segments"]
    check(len(snap["device_traces"]) == 1, "device_traces %r" % snap["device_traces"])
    check(sum(g["total_size"] for g in segs) == s["mapped"] and
          sum(g["allocated_size"] for g in segs) == s["live"],
          "segments against stats %r: %r" % (s, segs))
    live = {k["address"] for g in segs for k in g["blocks"] if k["state"] == "active_allocated"}
    check(live == {a, c}, "live blocks %r, allocations %r" % (live, (a, c)))
    for g in segs:
        check(sum(k["size"] for k in g["blocks"]) == g["total_size"], "blocks tile %r" % g)
    tmp = tempfile.mkdtemp()
    mine = os.path.join(tmp, "vpmm.pickle")
    vpmm.dump_snapshot(mine)
    with open(mine, "rb") as f:
        check(pickle.load(f) == snap, "dump_snapshot() wrote another snapshot")
    # vpmm-dump --torch-snapshot of this very process writes the same
    theirs = os.path.join(tmp, "dump.pickle")
    run([os.path.join(os.path.dirname(sys.executable), "vpmm-dump"), "--socket",
         os.environ["VPMM_SOCKET"], "--torch-snapshot", theirs], os.environ)
    with open(theirs, "rb") as f:
        check(pickle.load(f) == snap, "vpmm-dump --torch-snapshot differs from snapshot()")


def frames_of(snap, addr):
    for g in snap["segments"]:
        for b in g["blocks"]:
            if b["address"] == addr:
                return b["frames"], b["requested_size"], b["state"]
    return None


def allocate_here(malloc, size):
    line = sys._getframe().f_lineno + 1
    return malloc(size, 0, None), line


_held = None


def mem_malloc_held(size):
    """vpmm_torch_malloc called with the GIL held (ctypes.PyDLL)."""
    global _held
    if _held is None:
        import vpmm
        _held = ctypes.PyDLL(vpmm.library_path()).vpmm_torch_malloc
        _held.restype = ctypes.c_void_p
        _held.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return _held(size, 0, None)


def nested(depth, fn):
    return nested(depth - 1, fn) if depth else fn()


def s_history():
    import pickle
    import threading
    import torch
    import vpmm
    mem = torch.cuda.memory
    vpmm.enable()
    check(ctypes.CDLL("libcuda.so.1").cuInit(0) == 0, "cuInit")
    malloc, free = mem.current.malloc, mem.current.free
    before = malloc(2 * MIB, 0, None)
    check(vpmm.snapshot()["device_traces"] == [[]], "a trace before recording")
    for bad in (-1, 1.5, "10", True):
        try:
            vpmm.record_history(True, max_entries=bad)
            check(False, "max_entries=%r accepted" % (bad,))
        except ValueError:
            pass
    check(not vpmm._record.recording(), "bad arguments started the recording")

    vpmm.record_history(True)
    big, big_line = allocate_here(malloc, 3 * MIB + 5)
    small, small_line = nested(3, lambda: allocate_here(malloc, 1000))
    snap = vpmm.snapshot()
    here = os.path.abspath(__file__)
    for addr, line, size in ((big, big_line, 3 * MIB + 5), (small, small_line, 1000)):
        got = frames_of(snap, addr)
        check(got is not None and got[2] == "active_allocated", "no live block at %#x" % addr)
        frames, requested, _ = got
        check(frames and frames[0] == {"filename": here, "line": line, "name": "allocate_here"},
              "frames of the block at %#x: %r" % (addr, frames[:2]))
        check(frames[1]["name"] in ("s_history", "<lambda>") and
              all(set(f) == {"filename", "line", "name"} for f in frames),
              "the callers: %r" % frames)
        check(requested == size, "requested_size %d, asked %d" % (requested, size))
    check([f["name"] for f in frames_of(snap, small)[0][1:5]] ==
          ["<lambda>", "nested", "nested", "nested"], "the small block's stack")
    check(frames_of(snap, before)[0] == [], "a block from before recording has frames")
    trace = snap["device_traces"][0]
    check([(e["action"], e["addr"]) for e in trace] == [("alloc", big), ("alloc", small)],
          "trace %r" % [(e["action"], e["addr"]) for e in trace])
    check(trace[0]["frames"][0]["line"] == big_line and trace[0]["size"] == 3 * MIB + 5,
          "the alloc event %r" % trace[0])
    viz_replay(snap, 0)
    out = os.path.join(tempfile.mkdtemp(), "s.pickle")
    vpmm.dump_snapshot(out)
    with open(out, "rb") as f:
        data = f.read()
    viz_pickle(data)  # what memory_viz's unpickler reads
    check(pickle.loads(data)["device_traces"][0][:2] == trace, "dump_snapshot's trace")
    try:
        viz_pickle(pickle.dumps(snap, protocol=5))
        check(False, "viz_pickle accepted protocol 5")
    except AssertionError as e:
        check("protocol 5" in str(e), "viz_pickle: %s" % e)

    # frees: the block's frames go, the trace gets both halves of the free
    free(big, 3 * MIB + 5, 0, None)
    free(before, 2 * MIB, 0, None)  # allocated before: its free is recorded all the same
    free_line = sys._getframe().f_lineno - 1
    snap = vpmm.snapshot()
    check(vpmm._record.counts()["live"] == 1, "live records %r" % vpmm._record.counts())
    acts = [(e["action"], e["addr"]) for e in snap["device_traces"][0]]
    check(acts[2:] == [("free_requested", big), ("free_completed", big),
                       ("free_requested", before), ("free_completed", before)],
          "trace after the frees %r" % acts)
    last = snap["device_traces"][0][-1]
    check(last["size"] == 2 * MIB and last["frames"][0]["line"] == free_line,
          "the free of an allocation recorded before: %r" % last)
    viz_replay(snap, 0)

    # memory the trace used, since unmapped by the pool: a segment_unmap at
    # the end, without which memory_viz would draw blocks in no segment
    check(vpmm.empty_cache() > 0, "empty_cache released nothing")
    snap = vpmm.snapshot()
    unmaps = [e for e in snap["device_traces"][0] if e["action"] == "segment_unmap"]
    check(unmaps and any(u["addr"] <= big < u["addr"] + u["size"] for u in unmaps),
          "no segment_unmap for the trimmed memory: %r" % unmaps)
    viz_replay(snap, 0)
    cut = dict(snap, device_traces=[[e for e in snap["device_traces"][0]
                                     if e["action"] != "segment_unmap"]])
    try:
        viz_replay(cut, 0)
        check(False, "viz_replay accepted blocks outside every segment")
    except AssertionError as e:
        check("lies in no segment" in str(e), "viz_replay: %s" % e)

    # many allocations and frees from the same places: the tables stay as
    # large as the live allocations and the distinct call sites, and the
    # trace keeps its last max_entries events
    vpmm.record_history(True, max_entries=50)
    check(vpmm._record.counts()["trace"] == 0, "record_history(True) again kept events")
    keep = malloc(MIB, 0, None)

    def churn(n):
        for i in range(n):
            p = malloc((i % 7 + 1) * 70000, 0, None)
            q = malloc(300 + i % 5, 0, None)
            free(p, 0, 0, None)
            free(q, 0, 0, None)
        return vpmm._record.counts()

    c1, c2 = [churn(n) for n in (100, 1000)]  # from one line: the same stacks
    check(c2["live"] == c1["live"] == 1 and c2["frames"] == c1["frames"] and
          c2["stacks"] == c1["stacks"] and c2["trace"] == 50 and c2["dropped"] > c1["dropped"],
          "counts after 100 rounds %r, after 1100 %r" % (c1, c2))
    snap = vpmm.snapshot()
    check(len(snap["device_traces"][0]) >= 50, "trace of %d" % len(snap["device_traces"][0]))
    check(frames_of(snap, keep)[0][0]["name"] == "s_history", "the kept block's frames")
    viz_replay(snap, 0)

    # Python threads that released the GIL to allocate (ctypes.CDLL does,
    # as PyTorch's operators do) get their frames; threads Python never saw
    # (PyTorch's C++ threads) get events without frames, and no crash
    lib = ctypes.CDLL(vpmm.library_path())
    lib.vpmm_torch_malloc.restype = ctypes.c_void_p
    lib.vpmm_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.vpmm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                    ctypes.c_void_p]
    check(os.environ.get("CHECK_NATIVE_THREADS"),
          "CHECK_NATIVE_THREADS names no library (meson test sets it: native_threads.c)")
    native = ctypes.CDLL(os.environ["CHECK_NATIVE_THREADS"])
    native.native_threads.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                      ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    vpmm.record_history(True)
    got = []

    def worker():
        for _ in range(200):
            p = lib.vpmm_torch_malloc(5000, 0, None)
            lib.vpmm_torch_free(p, 5000, 0, None)
        got.append(lib.vpmm_torch_malloc(4 * MIB, 0, None))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    kept = (ctypes.c_void_p * 4)()
    check(native.native_threads(ctypes.cast(lib.vpmm_torch_malloc, ctypes.c_void_p),
                                ctypes.cast(lib.vpmm_torch_free, ctypes.c_void_p),
                                4, 200, kept) == 0, "native_threads")
    mine = []
    for _ in range(50):  # with the GIL held, while the Python threads run
        mine.append(mem_malloc_held(MIB))
    for t in threads:
        t.join()
    snap = vpmm.snapshot()
    for p in got:
        f = frames_of(snap, p)
        check(f and f[0] and f[0][0]["name"] == "worker" and f[1] == 4 * MIB,
              "a block allocated by a Python thread without the GIL: %r" % (f and f[:2],))
    for p in kept:
        f = frames_of(snap, p)
        check(f and f[0] == [] and f[1] == 4 * MIB,
              "a block allocated by a native thread: %r" % (f and f[:2],))
    for p in mine:
        check(frames_of(snap, p)[0][0]["name"] == "mem_malloc_held", "frames of %#x" % p)
    nofr = [e for e in snap["device_traces"][0] if not e["frames"]]
    # each free is two entries
    check(len(nofr) == 4 * (200 * 3 + 1), "%d events without frames" % len(nofr))
    viz_replay(snap, 0)

    # off: everything recorded is forgotten, and nothing more is recorded
    vpmm.record_history(False)
    check(not vpmm._record.recording() and
          all(v == 0 for k, v in vpmm._record.counts().items() if k not in ("dropped", "lost")),
          "counts after record_history(False): %r" % vpmm._record.counts())
    late = malloc(MIB, 0, None)
    snap = vpmm.snapshot()
    check(snap["device_traces"] == [[]] and
          all(b["frames"] == [] for g in snap["segments"] for b in g["blocks"]),
          "frames or events after record_history(False)")
    check(frames_of(snap, late)[1] == MIB, "block after stop %r" % (frames_of(snap, late),))
    # and the same as vpmm-dump --torch-snapshot again
    out = os.path.join(tempfile.mkdtemp(), "dump.pickle")
    run([os.path.join(os.path.dirname(sys.executable), "vpmm-dump"), "--socket",
         os.environ["VPMM_SOCKET"], "--torch-snapshot", out], os.environ)
    with open(out, "rb") as f:
        check(pickle.load(f) == snap, "vpmm-dump --torch-snapshot differs after record_history(False)")
    try:
        import torch.cuda._memory_viz  # noqa: F401
        print("memory_viz: checked by test/gpu/vpmm_package.py with PyTorch")
    except ImportError:
        print("skip: torch.cuda._memory_viz (the stand-in torch has none; "
              "test/gpu/vpmm_package.py renders it with PyTorch)")


# A program under `python -m vpmm run --no-torch` (the preload only) that
# allocates through the driver's own entry point while recording.
PRELOAD_CHILD = r"""
import ctypes, json, sys
import vpmm
cu = ctypes.PyDLL("libcuda.so.1")  # called with the GIL held, as a Python binding may
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
vpmm.record_history(True)
def driver_alloc():
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 20)) == 0
    return sys._getframe().f_lineno - 1
line = driver_alloc()
snap = vpmm.snapshot()
frames = [b["frames"] for g in snap["segments"] for b in g["blocks"] if b["address"] == ptr.value]
print(json.dumps({"line": line, "frames": frames,
                  "trace": [e["action"] for e in snap["device_traces"][0]]}))
"""


def s_history_preload():
    tmp = tempfile.mkdtemp()
    script = os.path.join(tmp, "child.py")
    with open(script, "w") as f:
        f.write(PRELOAD_CHILD)
    p = run([sys.executable, "-m", "vpmm", "run", "--no-torch", "--", sys.executable, script],
            base_env(LD_LIBRARY_PATH=FAKE_DIR, VPMM_SOCKET=os.path.join(tmp, "s.sock")))
    o = json.loads(p.stdout.strip().splitlines()[-1])
    check(len(o["frames"]) == 1 and o["frames"][0] and
          o["frames"][0][0] == {"filename": script, "line": o["line"], "name": "driver_alloc"},
          "frames of a cuMemAlloc_v2 under the preload: %r" % o)
    check(o["trace"] == ["alloc"], "trace under the preload: %r" % o["trace"])


def s_history_cost():
    """Prints the cost of recording per allocation and free, at a stack
    depth of about 30 frames (no figure is checked: it depends on the
    machine)."""
    import time
    import torch
    import vpmm
    mem = torch.cuda.memory
    vpmm.enable()
    check(ctypes.CDLL("libcuda.so.1").cuInit(0) == 0, "cuInit")
    malloc, free = mem.current.malloc, mem.current.free
    n = 20000

    def pairs():  # CPU time of this thread: the figure holds on a busy machine
        best = None
        for _ in range(5):
            t = time.thread_time()
            for _ in range(n):
                free(malloc(4096, 0, None), 4096, 0, None)
            dt = (time.thread_time() - t) / n
            best = dt if best is None else min(best, dt)
        return best

    depth = 30 - len(__import__("traceback").extract_stack())
    off = nested(depth, pairs)
    vpmm.record_history(True)
    on = nested(depth, pairs)
    vpmm.record_history(False)
    print("history cost: malloc+free pair %.2f us off, %.2f us on (+%.2f us) at stack depth 30 "
          "(CPU time)"
          % (off * 1e6, on * 1e6, (on - off) * 1e6))


def s_too_late():
    import torch
    import vpmm
    try:
        vpmm.enable()
    except vpmm.VpmmError as e:
        check("too late" in str(e) and "before the first CUDA" in str(e), "too late says: %s" % e)
        check(torch.cuda.memory.current is None, "an allocator was installed all the same")
        return
    check(False, "enable() after CUDA started did not raise")


# What a program started by `python -m vpmm run` sees (CHILD below).
CHILD = r"""
import ctypes, json, os, sys
out = {"env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "PYTHONPATH", "VPMM_LIBRARY")},
       "chained": getattr(__builtins__, "OTHER_SITECUSTOMIZE_RAN", False)}
try:
    ctypes.CDLL(None).vpmm_shim_stats_json
    out["preloaded"] = True
except AttributeError:
    out["preloaded"] = False
driver_alloc = None
if out["preloaded"]:
    # a plain CUDA driver allocation, as any CUDA program makes it
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    driver_alloc = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
out["driver_alloc"] = driver_alloc
import torch
cur = torch.cuda.memory.current
out["torch_allocator"] = cur and cur.path
if cur:
    assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0  # PyTorch starts CUDA first
    assert cur.malloc(1 << 20, 0, None)
import vpmm
out["library_path"] = vpmm.library_path()
out["mallocs"] = vpmm.stats().get("mallocs", 0)
print(json.dumps(out))
"""


def run_child(opts, env_extra, tmp, expect=0):
    script = os.path.join(tmp, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    env = base_env(**env_extra)
    return run([sys.executable, "-m", "vpmm", "run"] + opts + ["--", sys.executable, script],
               env, expect)


def s_run():
    import vpmm
    bundled = vpmm.library_path()
    tmp = tempfile.mkdtemp()
    other = os.path.join(tmp, "other")
    os.mkdir(other)
    with open(os.path.join(other, "sitecustomize.py"), "w") as f:
        # marks this process only (the `vpmm run` process runs it too)
        f.write("import builtins\nbuiltins.OTHER_SITECUSTOMIZE_RAN = True\n")
    pythonpath = TORCH_DIR + os.pathsep + other
    # everything: preload and PyTorch's allocator, one library for both
    p = run_child([], {"LD_LIBRARY_PATH": FAKE_DIR, "PYTHONPATH": pythonpath}, tmp)
    o = json.loads(p.stdout.strip().splitlines()[-1])
    check(o["env"]["LD_PRELOAD"].split(":")[0] == bundled, "LD_PRELOAD %r" % o["env"])
    check(o["env"]["PYTHONPATH"].split(os.pathsep)[1:] == [TORCH_DIR, other],
          "the program's own PYTHONPATH is not kept after vpmm's: %r" % o["env"])
    check(o["env"]["VPMM_LIBRARY"] == bundled, "VPMM_LIBRARY %r" % o["env"])
    check(o["preloaded"], "libvpmm.so is not in the program's global scope")
    check(o["chained"] is True, "the sitecustomize vpmm's hides did not run")
    check(o["driver_alloc"] == 0, "cuMemAlloc_v2 under the preload: %r" % o["driver_alloc"])
    check(o["torch_allocator"] == bundled, "torch's allocator: %r" % o["torch_allocator"])
    check(o["library_path"] == bundled, "vpmm in the program uses %r" % o["library_path"])
    check(o["mallocs"] == 2, "one pool should have served the driver's and torch's "
                             "allocations, mallocs %r" % o["mallocs"])
    check("vpmm: warning" not in p.stderr, "warnings: %s" % p.stderr)
    # --no-torch: the preload only
    o = json.loads(run_child(["--no-torch"], {"LD_LIBRARY_PATH": FAKE_DIR, "PYTHONPATH": TORCH_DIR},
                             tmp).stdout.splitlines()[-1])
    check(o["preloaded"] and o["torch_allocator"] is None and o["mallocs"] == 1,
          "--no-torch: %r" % o)
    # --no-preload: PyTorch's allocator only, from the library VPMM_LIBRARY names
    o = json.loads(run_child(["--no-preload"], {"LD_LIBRARY_PATH": FAKE_DIR, "PYTHONPATH": TORCH_DIR},
                             tmp).stdout.splitlines()[-1])
    check(not o["preloaded"] and o["env"]["LD_PRELOAD"] is None and
          o["torch_allocator"] == bundled and o["mallocs"] == 1, "--no-preload: %r" % o)
    # too late for PyTorch's allocator: a warning, and the program goes on
    p = run_child([], {"LD_LIBRARY_PATH": FAKE_DIR, "PYTHONPATH": TORCH_DIR,
                       "STANDIN_TORCH_CUDA_INITIALIZED": "1"}, tmp)
    o = json.loads(p.stdout.splitlines()[-1])
    check(o["torch_allocator"] is None and "vpmm: warning: PyTorch keeps its own allocator: too late"
          in p.stderr, "too late under run: %r, stderr %s" % (o, p.stderr))
    # the command's exit status, and commands that cannot run
    env = base_env()
    run([sys.executable, "-m", "vpmm", "run", "--", sys.executable, "-c", "raise SystemExit(7)"],
        env, expect=7)
    p = run([sys.executable, "-m", "vpmm", "run", "--", "/nonexistent/program"], env, expect=127)
    check("cannot run /nonexistent/program" in p.stderr, "stderr: %s" % p.stderr)
    run([sys.executable, "-m", "vpmm", "run"], env, expect=2)
    run([sys.executable, "-m", "vpmm"], env, expect=2)
    check("usage:" in run([sys.executable, "-m", "vpmm", "--help"], env).stdout, "--help")
    run([sys.executable, "-m", "vpmm", "run", "--bogus", "true"], env, expect=2)
    out = run([sys.executable, "-m", "vpmm", "version"], env).stdout
    check(out.startswith("vpmm %s, libvpmm %s" % (VERSION, VERSION)), "version: %s" % out)


SCENARIOS = {
    "installed": s_installed,
    "no-torch": s_no_torch,
    "enable-and-stats": s_enable_and_stats,
    "too-late": s_too_late,
    "snapshot": s_snapshot,
    "history": s_history,
    "history-preload": s_history_preload,
    "history-cost": s_history_cost,
    "run": s_run,
}


def main():
    if len(sys.argv) == 5:
        SCENARIOS[sys.argv[4]]()
        return
    if len(sys.argv) != 4:
        sys.exit("usage: check_package.py VERSION FAKE_CUDA_DIR STANDIN_TORCH_DIR")
    scenario("installed")
    scenario("no-torch")
    scenario("enable-and-stats", LD_LIBRARY_PATH=FAKE_DIR, PYTHONPATH=TORCH_DIR)
    scenario("too-late", PYTHONPATH=TORCH_DIR, STANDIN_TORCH_CUDA_INITIALIZED="1")
    sock_dir = tempfile.mkdtemp()
    scenario("snapshot", LD_LIBRARY_PATH=FAKE_DIR, PYTHONPATH=TORCH_DIR,
             VPMM_SOCKET=os.path.join(sock_dir, "s.sock"))
    scenario("history", LD_LIBRARY_PATH=FAKE_DIR, PYTHONPATH=TORCH_DIR,
             VPMM_SOCKET=os.path.join(sock_dir, "h.sock"))
    scenario("history-preload")
    scenario("history-cost", LD_LIBRARY_PATH=FAKE_DIR, PYTHONPATH=TORCH_DIR)
    scenario("run")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        sys.stderr.write("FAIL: %s\n" % e)
        sys.exit(1)
