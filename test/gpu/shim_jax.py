"""shim_jax.py MODE [STEPS] -- a small transformer trained in JAX with random
weights and data (fixed seed), its sequence length drawn from four every
step, for the shim's GPU check (scripts/gpu-shim.sh). Prints one JSON line:
the loss of every step, the median step time and peak memory as the mode can
see it.

MODE says how XLA allocates device memory; the script sets XLA's variables
itself, before JAX is imported. LD_PRELOAD comes from the caller:
  bfc        XLA's own BFC allocator, growing as needed (no preallocation):
             one mapping of XLA's own per region
  platform   XLA_PYTHON_CLIENT_ALLOCATOR=platform: one mapping of XLA's own
             per buffer, nothing cached
With LD_PRELOAD=libvpmm.so and EXPECT_POOL=1 the shim must be active.

The pool serves little of it: jaxlib 0.11's XLA maps every device buffer
itself (cuMemCreate, cuMemAddressReserve, cuMemMap: per region of its BFC
allocator, or per buffer with the platform allocator), and the shim leaves
programs' own virtual memory calls alone. What reaches the pool is what goes
through cuMemAlloc (cuBLAS and cuDNN workspaces). So this checks that JAX
runs unchanged under the preload, not what the pool saves it, and, with
EXPECT_POOL=1, that XLA's handles went past the shim's cuMemCreate hook
(which says so once on stderr).

Besides the losses, arrays kept across steps must read back unchanged, and
an element-wise result is compared with NumPy's exactly: memory the pool
handed out twice, or unmapped under live work, shows there.

nvml_peak: device memory used at its highest during the run, above what was
used once the context existed (sampled each millisecond).
"""
import json
import os
import statistics
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "bfc"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 120
if mode not in ("bfc", "platform"):
    sys.exit(f"shim_jax.py: unknown mode {mode!r} (bfc, platform)")
if steps < 2:
    sys.exit(f"shim_jax.py: {steps} steps: at least 2")
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
if mode == "platform":
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
# One GEMM algorithm whatever the process: losses comparable run to run.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from vpmm_probe import NvmlPeak, hook_calls, pool_stats  # noqa: E402


dev = jax.devices("gpu")[0]
jnp.ones(1, device=dev).block_until_ready()  # context and first module
nvml = NvmlPeak()

VOCAB, D, LAYERS, BATCH = 2048, 512, 4, 8
SEQS = (128, 256, 512, 768)


def init(key):
    ks = jax.random.split(key, 2 + 4 * LAYERS)
    s = 0.02
    p = {"emb": jax.random.normal(ks[0], (VOCAB, D)) * s,
         "out": jax.random.normal(ks[1], (D, VOCAB)) * s, "layers": []}
    for i in range(LAYERS):
        k = ks[2 + 4 * i: 6 + 4 * i]
        p["layers"].append({"qkv": jax.random.normal(k[0], (D, 3 * D)) * s,
                            "o": jax.random.normal(k[1], (D, D)) * s,
                            "up": jax.random.normal(k[2], (D, 4 * D)) * s,
                            "down": jax.random.normal(k[3], (4 * D, D)) * s})
    return p


def norm(x):
    return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def loss_fn(p, tok):
    x = p["emb"][tok[:, :-1]]
    t = x.shape[1]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for lp in p["layers"]:
        q, k, v = jnp.split(norm(x) @ lp["qkv"], 3, axis=-1)
        a = jnp.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(D), -1e9)
        x = x + (jax.nn.softmax(a, -1) @ v) @ lp["o"]
        x = x + jax.nn.gelu(norm(x) @ lp["up"]) @ lp["down"]
    logits = norm(x) @ p["out"]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, tok[:, 1:, None], -1).mean()


@jax.jit
def step(p, tok):
    loss, g = jax.value_and_grad(loss_fn)(p, tok)
    return jax.tree_util.tree_map(lambda w, d: w - 0.05 * d, p, g), loss


params = jax.device_put(init(jax.random.PRNGKey(0)), dev)
rng = np.random.default_rng(7)
losses, times, kept = [], [], []
for i in range(steps):
    seq = SEQS[int(rng.integers(len(SEQS)))]
    host = rng.integers(0, VOCAB, (BATCH, seq + 1), dtype=np.int32)
    t0 = time.perf_counter()
    params, loss = step(params, jax.device_put(host, dev))
    losses.append(float(loss))  # waits for the step
    times.append(time.perf_counter() - t0)
    if i % 10 == 0:  # some buffers live on across many steps
        x = rng.standard_normal(int(rng.integers(1, 1 << 20))).astype(np.float32)
        kept.append((jax.device_put(x, dev), x))
        if len(kept) > 6:
            kept.pop(0)
    if i % 25 == 0:
        x = rng.integers(-1 << 20, 1 << 20, 1 << 22, dtype=np.int32)
        y = np.asarray(jnp.flip(jax.device_put(x, dev)) * 3 + 1)  # integers: exact
        assert np.array_equal(y, x[::-1] * 3 + 1), f"step {i}: element-wise result"
for g, h in kept:
    assert np.array_equal(np.asarray(g), h), "an array kept across steps changed"
assert all(np.isfinite(losses)), "a loss is not finite"

warm = min(len(SEQS) * 3, steps // 2)
out = {
    "nvml_peak": nvml.done(),
    "mode": mode,
    "steps": steps,
    "losses": losses,
    "step_ms": statistics.median(times[warm:]) * 1e3,
    "card": dev.device_kind,
    "jax": jax.__version__,
}
ms = dev.memory_stats() or {}
if "peak_bytes_in_use" in ms:
    out["xla_peak_in_use"] = ms["peak_bytes_in_use"]
st = pool_stats()
if st:
    out.update(pool_mapped_peak=st["mapped_peak"], pool_live_peak=st["live_peak"],
               pool_mallocs=st["mallocs"], pool_defrags=st["defrags"],
               pool_handles_created=st.get("handles_created"),
               pool_handles_remapped=st.get("handles_remapped"))
own = hook_calls("cuMemCreate")
if own is not None:
    out["own_creates"] = own
if os.environ.get("EXPECT_POOL") == "1":
    assert st is not None, "EXPECT_POOL=1 but libvpmm.so is not active in this process"
    assert own is not None, "this libvpmm.so has no cuMemCreate hook"
    assert own > 0, "XLA made no handle of its own: does the pool serve it now? (README, JAX)"
print(json.dumps(out))
