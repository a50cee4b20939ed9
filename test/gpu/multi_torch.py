"""multi_torch.py MODE -- two GPUs under libvpmm (scripts/gpu-address.sh,
part multi of scripts/gpu-check.sh): torch.distributed with NCCL, one
process a GPU (torch.multiprocessing.spawn), all-reduce and all-gather on
tensors of the pool, every result checked; and peer copies between the two
devices' pools in one process.

MODE (the environment must match it; EXPECT_POOL=1: the pool must serve):
  dist          collectives; under LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1
                every tensor is a pool allocation (with NCCL_CUMEM_ENABLE=0
                NCCL's own buffers are too, shared between the ranks through
                the shim's cudaIpc*)
  pluggable     collectives, PyTorch's allocator CUDAPluggableAllocator over
                VPMM_LIB in each rank (no preload)
  register      collectives with PyTorch's caching allocator on pool memory
                (preload) and TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1:
                every segment goes through ncclCommRegister. NCCL asks the
                shim for the segment's range and handle; the handle is
                refused, and NCCL registers through legacy IPC
                (NCCL_LEGACY_CUDA_REGISTER=1, served by the shim) or not at
                all (its copy path). Results must be right either way.
  graph         all-reduce and all-gather captured in a CUDA graph
                (torch.cuda.graph) on tensors of PyTorch's caching allocator
                (under LD_PRELOAD: on pool memory), replayed 5 times with new
                inputs, every result checked: NCCL registers a captured
                buffer itself (NCCL_GRAPH_REGISTER) or copies through its own
                buffers; results must be right either way
  ncclmem       collectives on a torch.cuda.MemPool over NCCL's own allocator
                (ncclMemAlloc: memory NCCL maps itself, under the preload),
                registered with the communicator
  peer          one process: tensors copied between cuda:0 and cuda:1
                (contiguous: cudaMemcpyPeer; strided: a kernel reading the
                peer's pages), and cudaMemcpyPeer through CuPy when present
Prints PASS/FAIL (and SKIP) lines; exit 0 when nothing failed."""
import os
import socket
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vpmm_probe import pool_stats  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "dist"
expect_pool = os.environ.get("EXPECT_POOL") == "1"
N = 1 << 22  # floats: 16 MiB a tensor


def say(ok, name, detail=""):
    print(("PASS " if ok else "FAIL ") + f"{mode} {name}" + (f" ({detail})" if detail else ""),
          flush=True)
    return ok


def served(dev):
    """Whether libvpmm's pool of `dev` served allocations in this process."""
    lib = os.environ.get("VPMM_LIB") if mode == "pluggable" else None
    s = pool_stats(lib, dev)
    return s is not None and s.get("mallocs", 0) > 0, s and s.get("mallocs")


def collectives(rank, dev):
    ok = True
    for it in range(5):
        # fresh tensors every round: the pool reuses what the last freed
        x = torch.full((N,), float(rank + 1), device=dev)
        torch.distributed.all_reduce(x)
        ok &= say(bool(torch.all(x == 3.0)), f"rank {rank} all_reduce round {it}")
        # a view inside a larger allocation: its base is not the allocation's
        big = torch.arange(2 * N, device=dev, dtype=torch.float32) * (rank + 1)
        view = big[N // 2 + 3: N // 2 + 3 + N]
        torch.distributed.all_reduce(view)
        want = torch.arange(N // 2 + 3, N // 2 + 3 + N, device=dev, dtype=torch.float32) * 3
        ok &= say(bool(torch.equal(view, want)), f"rank {rank} all_reduce of a view round {it}")
        mine = torch.full((N,), float(10 * rank + it), device=dev)
        out = [torch.empty(N, device=dev) for _ in range(2)]
        torch.distributed.all_gather(out, mine)
        ok &= say(all(bool(torch.all(out[r] == float(10 * r + it))) for r in range(2)),
                  f"rank {rank} all_gather round {it}")
        flat = torch.empty(2 * N, device=dev)
        torch.distributed.all_gather_into_tensor(flat, mine)
        ok &= say(bool(torch.all(flat[:N] == float(it))) and bool(torch.all(flat[N:] == float(10 + it))),
                  f"rank {rank} all_gather_into_tensor round {it}")
        del x, big, view, want, mine, out, flat
    torch.cuda.synchronize(dev)
    return ok


def ncclmem(rank, dev):
    pg = torch.distributed.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
    except (AttributeError, RuntimeError, TypeError) as e:
        print(f"SKIP ncclmem: this PyTorch has no NCCL MemPool ({e})", flush=True)
        return True
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((N,), float(rank + 1), device=dev)
        out = [torch.empty(N, device=dev) for _ in range(2)]
    backend.register_mem_pool(pool)
    torch.distributed.all_reduce(x)
    ok = say(bool(torch.all(x == 3.0)), f"rank {rank} all_reduce on NCCL memory")
    torch.distributed.all_gather(out, x)
    ok &= say(all(bool(torch.all(o == 3.0)) for o in out), f"rank {rank} all_gather on NCCL memory")
    torch.cuda.synchronize(dev)
    backend.deregister_mem_pool(pool)
    del x, out
    return ok


def graph(rank, dev):
    x = torch.empty(N, device=dev)
    mine = torch.empty(N, device=dev)
    flat = torch.empty(2 * N, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # the warm-up PyTorch asks for, uncaptured
        for _ in range(3):
            x.fill_(1.0)
            mine.fill_(0.0)
            torch.distributed.all_reduce(x)
            torch.distributed.all_gather_into_tensor(flat, mine)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.distributed.all_reduce(x)
        torch.distributed.all_gather_into_tensor(flat, mine)
    ok = True
    for it in range(5):
        x.fill_(float(rank + 1 + it))
        mine.fill_(float(10 * rank + it))
        g.replay()
        torch.cuda.synchronize(dev)
        ok &= say(bool(torch.all(x == float(3 + 2 * it))),
                  f"rank {rank} captured all_reduce replay {it}")
        ok &= say(bool(torch.all(flat[:N] == float(it))) and bool(torch.all(flat[N:] == float(10 + it))),
                  f"rank {rank} captured all_gather_into_tensor replay {it}")
    del g
    torch.cuda.synchronize(dev)
    return ok


def rank_main(rank, port, results):
    dev = torch.device("cuda", rank)
    if mode == "pluggable":
        # before set_device, which initialises the allocator: PyTorch then
        # refuses the swap ("Can't swap an already initialized allocator",
        # the first GPU run)
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            os.environ["VPMM_LIB"], "vpmm_torch_malloc", "vpmm_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    torch.cuda.set_device(dev)
    kw = dict(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.distributed.init_process_group(device_id=dev, **kw)
    except TypeError:
        torch.distributed.init_process_group(**kw)
    ok = True
    try:
        ok = {"ncclmem": ncclmem, "graph": graph}.get(mode, collectives)(rank, dev)
        if expect_pool and mode != "ncclmem":
            s, n = served(rank)
            ok &= say(s, f"rank {rank} tensors served by the pool", f"mallocs {n}")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    results[rank] = ok


def peer():
    ok = True
    if not torch.cuda.can_device_access_peer(0, 1):
        print("SKIP peer: the two devices have no peer access", flush=True)
        return True
    for it in range(3):
        x0 = torch.arange(N, device="cuda:0", dtype=torch.float32) + it
        y1 = x0.to("cuda:1")  # contiguous: a peer copy
        ok &= say(bool(torch.equal(y1.cpu(), x0.cpu())), f"contiguous 0->1 round {it}")
        z1 = x0[::2].to("cuda:1")  # strided: a kernel reads the peer's pages
        ok &= say(bool(torch.equal(z1.cpu(), x0[::2].cpu())), f"strided 0->1 round {it}")
        back = (y1 * 2)[1::3].to("cuda:0")
        ok &= say(bool(torch.equal(back.cpu(), (x0 * 2)[1::3].cpu())), f"strided 1->0 round {it}")
        del x0, y1, z1, back
    try:
        import cupy
    except ImportError:
        print("SKIP peer cupy: no CuPy", flush=True)
        cupy = None
    if cupy is not None:
        src = torch.arange(N, device="cuda:1", dtype=torch.float32)
        dst = torch.zeros(N, device="cuda:0", dtype=torch.float32)
        torch.cuda.synchronize(1)
        with cupy.cuda.Device(0):
            try:
                cupy.cuda.runtime.deviceEnablePeerAccess(1)
            except cupy.cuda.runtime.CUDARuntimeError:
                pass  # already enabled by PyTorch
            cupy.cuda.runtime.memcpyPeer(dst.data_ptr(), 0, src.data_ptr(), 1, N * 4)
            cupy.cuda.runtime.deviceSynchronize()
        ok &= say(bool(torch.equal(dst.cpu(), src.cpu())), "cudaMemcpyPeer 1->0 (CuPy)")
    if expect_pool:
        for d in (0, 1):
            s, n = served(d)
            ok &= say(s, f"device {d} tensors served by the pool", f"mallocs {n}")
    return ok


def main():
    if torch.cuda.device_count() < 2:
        print(f"SKIP multi {mode}: {torch.cuda.device_count()} GPU(s), 2 needed", flush=True)
        return 0
    if mode == "peer":
        return 0 if peer() else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mgr = torch.multiprocessing.Manager()
    results = mgr.dict()
    torch.multiprocessing.spawn(rank_main, args=(port, results), nprocs=2, join=True)
    ok = len(results) == 2 and all(results.values())
    say(ok, "both ranks")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
