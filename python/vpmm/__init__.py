"""vpmm -- libvpmm, a GPU memory pool for CUDA programs that does not
fragment, from Python. The package carries libvpmm.so and the tools
vpmm-dump and vpmm-replay.

    import torch, vpmm
    vpmm.enable()            # before the first CUDA tensor
    ...
    vpmm.memory_stats()      # torch.cuda.memory_stats()'s keys
    vpmm.empty_cache()       # free memory back to the driver
    vpmm.record_history(True)        # Python stack frames of each allocation
    vpmm.dump_snapshot("s.pickle")   # for pytorch.org/memory_viz

    python -m vpmm run -- python train.py    # any program, no code change

Every function works with the library the process already has (preloaded
by `python -m vpmm run` or LD_PRELOAD) or else with the bundled one, so
that a process never holds two pools. Failures raise VpmmError saying why.
"""
from ._lib import VpmmError, library_path
from . import _lib, _record, _snapshot, _torch
from ._version import __version__

__all__ = ["VpmmError", "enable", "enabled", "stats", "memory_stats", "empty_cache",
           "layout", "snapshot", "dump_snapshot", "record_history", "active", "library_path",
           "library_version", "__version__"]


def enable():
    """Makes libvpmm.so PyTorch's CUDA allocator
    (torch.cuda.memory.CUDAPluggableAllocator with vpmm_torch_malloc and
    vpmm_torch_free: stream-ordered, no device synchronisation on free).
    Call it after `import torch` and before the first CUDA tensor. Returns
    the library's path; a second call does nothing. Raises VpmmError when
    torch is missing or has already initialised CUDA."""
    return _torch.enable()


def enabled():
    """The library's path if enable() made it PyTorch's allocator, else None."""
    return _torch.enabled()


def active():
    """Whether the library serves allocations in this process: False when
    VPMM_DISABLE=1, a VPMM_* setting is bad, or there is no CUDA driver.
    Reads the VPMM_* settings and opens the driver on the first call."""
    return bool(_lib.handle().vpmm_shim_active())


def library_version():
    """The version of the libvpmm.so in use (this package's own, unless the
    process preloaded another)."""
    return _lib.handle().vpmm_version().decode()


def stats(device=0):
    """The pool's counters on `device` as a dict: bytes live, mapped,
    reusable, holes, zombies, reserved (each with its _peak), and the
    counts mallocs, frees, failures, defrags, pages_created,
    pages_remapped, pages_released, ... (vpmm/stats.h says what each is).
    An empty dict while the device has no pool (nothing allocated yet)."""
    return _lib.stats_json(device) or {}


def memory_stats(device=0):
    """The pool's counters under the names torch.cuda.memory_stats() uses,
    for those that have a meaning here (only the ".all" pools: the pool
    has no large and small pools):

      allocated_bytes.all.current/peak    bytes handed out (live)
      active_bytes.all.current/peak       the same: a freed block is reusable
                                          at once on its stream
      reserved_bytes.all.current/peak     physical memory held (mapped)
      inactive_split_bytes.all.current/peak  free memory held (reusable)
      allocation.all.allocated/freed/current  allocations, frees, live ones
      active.all.current                  live allocations
      num_alloc_retries                   allocations that found no free
                                          range and remapped or grew (defrags)
      num_ooms                            failed allocations
      num_device_alloc                    physical handles created

    An empty dict while the device has no pool, as torch's before CUDA
    starts."""
    s = stats(device)
    if not s:
        return {}
    live_count = s["mallocs"] - s["frees"]
    return {
        "allocated_bytes.all.current": s["live"],
        "allocated_bytes.all.peak": s["live_peak"],
        "active_bytes.all.current": s["live"],
        "active_bytes.all.peak": s["live_peak"],
        "reserved_bytes.all.current": s["mapped"],
        "reserved_bytes.all.peak": s["mapped_peak"],
        "inactive_split_bytes.all.current": s["reusable"],
        "inactive_split_bytes.all.peak": s["reusable_peak"],
        "allocation.all.allocated": s["mallocs"],
        "allocation.all.freed": s["frees"],
        "allocation.all.current": live_count,
        "active.all.current": live_count,
        "num_alloc_retries": s["defrags"],
        "num_ooms": s["failures"],
        "num_device_alloc": s["handles_created"],
    }


def empty_cache(device=None, keep=0, wait=True):
    """Gives free memory back to the driver: the pool unmaps and releases
    its free pages, keeping at most `keep` reusable bytes, on `device` or on
    every device (None). Returns the bytes released (0 where there is no
    pool). With wait (the default), the device's queued work completes
    first, as torch.cuda.empty_cache() waits for it, so that every free page
    can go; with wait=False, memory whose queued work has not completed
    stays."""
    if keep < 0:
        raise ValueError("keep must be 0 or more bytes")
    return _lib.trim(-1 if device is None else device, keep, wait)


def snapshot():
    """Every pool of the process as PyTorch's memory snapshot (the dict of
    torch.cuda.memory._snapshot(): "segments" with their "blocks", and
    "device_traces"). Without record_history(True), the same as `vpmm-dump
    --torch-snapshot` writes: no frames, empty device_traces. While it
    records, the blocks of the allocations made since carry their Python
    stack frames ("frames": [{"filename", "line", "name"}, ...], innermost
    first) and the bytes asked for, and device_traces the events since,
    with their frames. Read through the process's own vpmm socket: raises
    VpmmError with VPMM_SOCKET=off."""
    return _snapshot.snapshot()


def record_history(enabled=True, max_entries=_record.DEFAULT_ENTRIES):
    """Records, from now on, each allocation and free the pool takes in
    this process (PyTorch's through enable(), and those of the preload),
    with the Python stack frames of the thread that made it, for
    snapshot() (as torch.cuda.memory._record_memory_history does for
    PyTorch's allocator). A thread with no Python code above the
    allocation (PyTorch's C++ threads: autograd's backward) gets its
    events without frames; one that released the GIL (PyTorch's
    operators do) has it taken again for the walk.
    device_traces keeps the latest `max_entries` events (0: none, only the
    live blocks' frames). Calling it again starts afresh; enabled=False
    stops and forgets everything recorded, so take the snapshot first.
    Costs a few microseconds per allocation and per free while on
    (docs/install.md, "Allocation history"), two atomic loads while off.
    Raises VpmmError when the library or the package cannot record."""
    _record.record_history(enabled, max_entries)


def dump_snapshot(path):
    """snapshot() pickled into `path`, for pytorch.org/memory_viz (as
    torch.cuda.memory._dump_snapshot writes it), with pickle's protocol 4:
    memory_viz reads protocols 2 to 4, and Python 3.14 writes 5 unless
    told."""
    import pickle
    snap = snapshot()
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return snap


def layout(device=0, unit=0):
    """The pool's region map, such as "[4M][*6M][1M][-11M]" (live, hole *,
    free -, awaiting unmap ~; sizes in multiples of `unit` bytes, or with a
    K/M/G/T suffix when unit is 0), or None while the device has no pool."""
    return _lib.layout(device, unit)
