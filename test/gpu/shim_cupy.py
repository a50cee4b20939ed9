"""shim_cupy.py -- a CuPy workload for the shim's GPU check
(scripts/gpu-shim.sh): matrix products, element-wise work and reductions on
arrays of many sizes, each result checked against NumPy, first with CuPy's
pool disabled (cudaMalloc/cudaFree per array), then with its stream-ordered
allocator (cudaMallocAsync) on several streams. With EXPECT_POOL=1 the pool's
stats must show both phases' allocations. Prints PASS or raises.
"""
import os

import cupy as cp
import numpy as np

from vpmm_probe import pool_stats


def workload(rng, rounds, stream=None):
    kept = []
    for r in range(rounds):
        n = int(rng.integers(16, 1024))
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        with (stream or cp.cuda.Stream.null):
            ga, gb = cp.asarray(a), cp.asarray(b)
            gc = ga @ gb
            gd = cp.tanh(gc) * 2 + ga
            s = float(gd.sum())
            c = cp.asnumpy(gc)
        ref = a @ b
        assert np.allclose(c, ref, rtol=1e-3, atol=1e-2), f"round {r}: matmul"
        assert np.isclose(s, float((np.tanh(ref) * 2 + a).sum()), rtol=1e-3, atol=1.0), f"round {r}: sum"
        if r % 3 == 0:
            kept.append((ga, a))  # some arrays live on across rounds
        if len(kept) > 8:
            kept.pop(0)
    for g, h in kept:
        assert np.array_equal(cp.asnumpy(g), h), "kept array changed"


expect = os.environ.get("EXPECT_POOL") == "1"
rng = np.random.default_rng(3)

cp.cuda.set_allocator(None)  # no CuPy pool: every array is a cudaMalloc
workload(rng, 60)
s1 = pool_stats()
print("stats after cudaMalloc phase:", s1)

cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)  # cudaMallocAsync
streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
for i, st in enumerate(streams):
    workload(rng, 20, st)
for st in streams:
    st.synchronize()
s2 = pool_stats()
print("stats after cudaMallocAsync phase:", s2)

if expect:
    assert s1 and s1["mallocs"] > 100, "the cudaMalloc phase did not use the pool"
    assert s2 and s2["mallocs"] > s1["mallocs"] + 50, "the async phase did not use the pool"
print("PASS")
