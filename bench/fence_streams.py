"""fence_streams.py — what the preload's fences cost as a program's
non-blocking streams grow, against synchronising the context in every free.

Under the preload with PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1),
every tensor PyTorch frees is a synchronous cudaFree. While the context has
at most VPMM_FENCE_STREAMS_MAX non-blocking streams, the shim orders such a
free by fences over each of them (docs/shim.md); past that, it synchronises
the context. The fences' calls grow with the streams, the synchronisation's
cost does not: this program times a small training step with a given number
of streams so that the two can be set side by side in one call (part
`fences` of scripts/gpu-check.sh runs the combinations).

  --side       use a torch.cuda.Stream() for part of each step (PyTorch 2.11
               makes its stream pools, 128 non-blocking streams, then)
  --extra K    make K more idle non-blocking streams with cuStreamCreate,
               through the preload's hook so that the shim counts them
               (libcuda's own without the preload)
  --steps N    timed steps (40), after 5 untimed
  --layers L   linear layers of D x D (12), batch 256
  --dim D      their width (1024: the host sets the pace, the GPU idles
               between frees; 4096: the GPU sets it, the host runs ahead)

Prints one line: "fence_streams dim=D side=0|1 extra=K ms_step=X" and the shim's
counts of frees fenced and synchronised, which say which way the frees went
(-1 without the preload).
"""
import argparse
import ctypes
import sys
import time

import torch


def shim_count(lib, name):
    """One of the shim's hook counters, or -1 where there is none (no
    preload)."""
    try:
        f = lib.vpmm_shim_hook_calls
    except AttributeError:
        return -1
    f.restype = ctypes.c_ulonglong
    f.argtypes = [ctypes.c_char_p]
    v = f(name.encode())
    return -1 if v == (1 << 64) - 1 else int(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", action="store_true")
    ap.add_argument("--extra", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=1024)
    a = ap.parse_args()

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(a.dim, a.dim),
                                                      torch.nn.ReLU())
                                  for _ in range(a.layers)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, a.dim, device=dev)
    side = torch.cuda.Stream() if a.side else None

    glob = ctypes.CDLL(None)   # the preload's exports come first
    extra = []
    if a.extra:
        try:
            create = glob.cuStreamCreate
        except AttributeError:   # no preload: libcuda's own, not global
            create = ctypes.CDLL("libcuda.so.1").cuStreamCreate
        create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        for _ in range(a.extra):
            s = ctypes.c_void_p()
            r = create(ctypes.byref(s), 1)   # CU_STREAM_NON_BLOCKING
            if r != 0:
                print(f"fence_streams: cuStreamCreate failed ({r})", file=sys.stderr)
                return 1
            extra.append(s)

    def step():
        y = x
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 0.5
            torch.cuda.current_stream().wait_stream(side)
            y.record_stream(torch.cuda.current_stream())
        loss = model(y).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    fenced0 = shim_count(glob, "fence_free")
    synced0 = shim_count(glob, "sync_free")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    fenced = shim_count(glob, "fence_free")
    synced = shim_count(glob, "sync_free")
    print(f"fence_streams dim={a.dim} side={int(a.side)} extra={a.extra} ms_step={ms:.3f} "
          f"fenced_frees={fenced - fenced0 if fenced >= 0 else -1} "
          f"synced_frees={synced - synced0 if synced >= 0 else -1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
