#!/usr/bin/env python3
"""share_torch.py — CUDA tensors shared between two torch.multiprocessing
processes (on the GPU; scripts/gpu-share.sh runs it with and without
the shim, in PyTorch's no-caching mode and with its caching allocator).

The parent makes tensors of several sizes (a few KiB to 1 GiB) and sends them
to a spawned child, which checks their contents against checksums computed
in the parent, adds 1 to every element in place and reports; the parent then
checks that it sees the child's writes. Exit status 0 and a last line
"share_torch ok" when everything matched.

How the tensors travel:
  - caching allocator: through the queue itself (PyTorch's CUDA reductions:
    cudaIpcGetMemHandle of the segment, cudaIpcOpenMemHandle in the child);
  - PYTORCH_NO_CUDA_MEMORY_CACHING=1: PyTorch's reductions refuse such
    storages ("invalid device pointer": they need the caching allocator's
    segment table), natively as under the shim, which this script checks
    first. The tensors' memory is then shared with cudaIpcGetMemHandle /
    cudaIpcOpenMemHandle called through ctypes, the handles sent through the
    queue, and the child wraps the opened memory as a tensor without a copy
    (__cuda_array_interface__).
"""
import ctypes
import glob
import os
import sys

import torch
import torch.multiprocessing as mp

SIZES = [1 << 12, 8 << 10, 3 << 20, 96 << 20, 1 << 30]  # bytes


NO_CACHING = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"


def cudart():
    """The CUDA runtime PyTorch loaded (any will do: one primary context)."""
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    names += glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*"))
    names += glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    names += ["/usr/local/cuda/lib64/libcudart.so"]
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise RuntimeError("no libcudart found")


class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class Wrapped:
    """Device memory as a tensor-to-be, without a copy."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "<i4", "data": (ptr, False), "version": 3}


def child(q_in, q_out):
    torch.cuda.init()
    rt = cudart() if NO_CACHING else None
    got = []
    while True:
        item = q_in.get()
        if item is None:
            break
        if NO_CACHING:
            raw, n, want = item
            h = Handle.from_buffer_copy(raw)
            ptr = ctypes.c_void_p()
            err = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, 1)
            if err != 0:
                print("child: cudaIpcOpenMemHandle error", err, flush=True)
                got.append(False)
                continue
            t = torch.as_tensor(Wrapped(ptr.value, n), device="cuda")
        else:
            t, want = item
        ok = int(t.sum(dtype=torch.int64).item()) == want
        t.add_(1)
        torch.cuda.synchronize()
        got.append(ok)
        del t
        if NO_CACHING:
            err = rt.cudaIpcCloseMemHandle(ptr)
            if err != 0:
                print("child: cudaIpcCloseMemHandle error", err, flush=True)
                got[-1] = False
    q_out.put(got)


def torch_refuses_no_caching(t):
    """PyTorch's own CUDA reduction on a no-caching storage: its error."""
    from torch.multiprocessing.reductions import reduce_tensor
    try:
        reduce_tensor(t)
    except RuntimeError as e:
        return str(e)
    return None


def main():
    mp.set_start_method("spawn")
    dev = torch.device("cuda", 0)
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q_in, q_out))
    p.start()
    tensors = []
    rt = cudart() if NO_CACHING else None
    for i, nbytes in enumerate(SIZES):
        n = nbytes // 4
        t = torch.randint(0, 1000, (n,), dtype=torch.int32, device=dev)
        want = int(t.sum(dtype=torch.int64).item())
        tensors.append((t, want))
        if not NO_CACHING:
            q_in.put((t, want))
            continue
        if i == 0:
            e = torch_refuses_no_caching(t)
            print("PyTorch's reduction of a no-caching storage:", e or "accepted")
        h = Handle()
        err = rt.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(t.data_ptr()))
        if err != 0:
            print("FAIL: cudaIpcGetMemHandle error", err)
            q_in.put(None)
            p.join()
            return 1
        q_in.put((bytes(h), n, want))  # all 64 bytes, NULs included
    torch.cuda.synchronize()
    q_in.put(None)
    got = q_out.get(timeout=300)
    p.join(timeout=120)
    bad = []
    for i, ((t, want), ok) in enumerate(zip(tensors, got)):
        seen = int(t.sum(dtype=torch.int64).item())
        # every element grew by one in the child
        if not ok or seen != want + t.numel():
            bad.append((SIZES[i], ok, seen - want, t.numel()))
    print("sizes", SIZES, "child checks", got)
    stats = None
    try:
        lib = ctypes.CDLL(None)
        buf = ctypes.create_string_buffer(8192)
        if hasattr(lib, "vpmm_shim_stats_json") and lib.vpmm_shim_stats_json(0, buf, 8192) > 0:
            stats = buf.value.decode()
    except OSError:
        pass
    print("pool stats:", stats)
    if os.environ.get("EXPECT_POOL") == "1" and not stats:
        print("FAIL: no pool under the shim")
        return 1
    if p.exitcode != 0 or bad or len(got) != len(SIZES):
        print("FAIL: child exit", p.exitcode, "mismatches", bad)
        return 1
    print("share_torch ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
