#!/usr/bin/env bash
# gpu-shim.sh — libvpmm.so on a real GPU. Needs gcc,
# nvcc, python3 with torch, cupy and pynvml (nvidia-ml-py), compute-sanitizer,
# and JAX with a GPU for step 6 (reported as skipped without); no meson. Run from
# anywhere; results go to $OUT (default build-gpu-shim/): gpu-shim.log
# (everything), torch-*.json, lab.json, jax-*.json, summary.txt.
#
#   1. test/gpu/shim_cuda.cu built with nvcc's defaults (static runtime) and
#      with -cudart shared, run without and with the shim (data checked by
#      kernels, pool stats required under the shim, call timings printed;
#      cudaFree by fences, and once more by synchronisations:
#      VPMM_SYNC_FREE=device);
#   2. test/gpu/shim_cupy.py under the shim;
#   3. test/gpu/shim_torch.py: PyTorch native, expandable_segments, no
#      caching, no caching + shim, CUDAPluggableAllocator; the loss curves of
#      the shim runs must equal the no-caching run's; test/gpu/torch_oom.py:
#      the pluggable pair refusing more than the device has, raised in
#      Python with what the pool held (torch-oom);
#   4. compute-sanitizer --tool memcheck on 1 (static, --quick) under the shim;
#   5. test/gpu/shim_lab.py: the laboratory cases through PyTorch;
#   6. test/gpu/shim_jax.py: JAX with XLA's BFC allocator, then under the
#      shim with it and with XLA's platform allocator; the shim runs' losses
#      must match the plain run's (XLA maps its buffers itself, so this
#      checks that JAX runs unchanged, not that the pool serves it);
#   7. test/gpu/contexts.cu: contexts the program makes, destroys, resets
#      and releases, each scenario without and with the shim; device_reset
#      (cudaDeviceReset, which the CUDA 13 runtime does where no hook sees
#      it) with the static and the shared runtime.
# Exit status: 0 when every step passed.
#
# Environment: SHIM_STEPS (torch steps, default 300), SHIM_JAX_STEPS (JAX
# steps, default 120), SHIM_ONLY (a regex of step names to run), CUDA_HOME
# (default /usr/local/cuda), GPU_ARCH (sm_90).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu-shim}
CUDA=${CUDA_HOME:-/usr/local/cuda}
ARCH=${GPU_ARCH:-sm_90}
STEPS=${SHIM_STEPS:-300}
JAX_STEPS=${SHIM_JAX_STEPS:-120}
ONLY=${SHIM_ONLY:-.}
W=$(mktemp -d)
mkdir -p "$OUT"
LOG=$OUT/gpu-shim.log
: >"$LOG"
export PATH=$CUDA/bin:$PATH PYTHONUNBUFFERED=1
RESULTS=()
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }

# step NAME COMMAND...: runs it (output to the log and the terminal), records
# the outcome; skipped unless NAME matches SHIM_ONLY.
step() {
	local name=$1
	shift
	if ! [[ $name =~ $ONLY ]]; then
		return 0
	fi
	say "== $name: $*"
	local t0=$SECONDS
	"$@" 2>&1 | tee -a "$LOG"
	local rc=${PIPESTATUS[0]}
	if [ "$rc" -eq 0 ]; then
		RESULTS+=("ok      $name ($((SECONDS - t0)) s)")
	else
		RESULTS+=("FAILED  $name (exit $rc, $((SECONDS - t0)) s)")
		FAILED=1
	fi
	return 0
}

say "gpu-shim: $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# ---- build (no meson: scripts/gpu-build.sh, the flags meson uses) --------------
# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
VPMM_BUILD_CFLAGS=-g
build() {
	vpmm_build_lib "$W/libvpmm.so" &&
		nvcc -O2 -arch="$ARCH" -o "$W/shim_cuda_static" "$ROOT/test/gpu/shim_cuda.cu" &&
		nvcc -O2 -arch="$ARCH" -cudart shared -o "$W/shim_cuda_shared" "$ROOT/test/gpu/shim_cuda.cu" &&
		nvcc -O2 -arch="$ARCH" -o "$W/contexts" "$ROOT/test/gpu/contexts.cu" -lcuda &&
		nvcc -O2 -arch="$ARCH" -cudart shared -o "$W/contexts_shared" "$ROOT/test/gpu/contexts.cu" -lcuda
}
step build build
LIB=$W/libvpmm.so
if [ ! -f "$LIB" ]; then
	printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
	exit 1
fi

# ---- 1 and 4: the CUDA program -------------------------------------------------------
step cuda-static-plain "$W/shim_cuda_static"
step cuda-static-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/shim_cuda_static"
step cuda-shared-plain "$W/shim_cuda_shared"
step cuda-shared-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/shim_cuda_shared"
# the synchronous frees by synchronisation, as before the fences
step cuda-static-shim-sync env LD_PRELOAD="$LIB" EXPECT_POOL=1 VPMM_SYNC_FREE=device \
	"$W/shim_cuda_static"
# ---- 7: contexts ------------------------------------------------------------------------
ctx_scenarios="user_context user_default primary_release ctx_destroy device_reset"
for sc in $ctx_scenarios; do
	step "ctx-$sc-plain" "$W/contexts" "$sc"
	step "ctx-$sc-shim" env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/contexts" "$sc"
done
# The reset again with the shared runtime: its private table, too, must
# stay out of the pool's way.
step ctx-device_reset-shared-plain "$W/contexts_shared" device_reset
step ctx-device_reset-shared-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/contexts_shared" device_reset
memcheck() {
	LD_PRELOAD="$LIB" EXPECT_POOL=1 compute-sanitizer --tool memcheck \
		--error-exitcode 9 "$W/shim_cuda_static" --quick
}
step memcheck-static memcheck

# ---- 2: CuPy ----------------------------------------------------------------------------------
step cupy-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 python3 "$ROOT/test/gpu/shim_cupy.py"

# ---- 3: PyTorch training ------------------------------------------------------------------
torch_run() { # MODE ENV...
	local mode=$1
	shift
	env "$@" python3 "$ROOT/test/gpu/shim_torch.py" "$mode" "$STEPS" >"$OUT/torch-$mode.json" &&
		cut -c1-300 "$OUT/torch-$mode.json"
}
step torch-native torch_run native
step torch-expandable torch_run expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step torch-nocache torch_run nocache PYTORCH_NO_CUDA_MEMORY_CACHING=1
step torch-shim torch_run shim PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB"
step torch-pluggable torch_run pluggable VPMM_LIB="$LIB"
step torch-oom env VPMM_LIB="$LIB" python3 "$ROOT/test/gpu/torch_oom.py"
build_async() {
	nvcc -O2 -arch="$ARCH" -shared -Xcompiler -fPIC -o "$W/libtorch_async.so" \
		"$ROOT/test/gpu/torch_async_alloc.cu"
}
step torch-async-build build_async
step torch-pluggable-async torch_run pluggable-async ASYNC_LIB="$W/libtorch_async.so"
torch_compare() {
	python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
runs = {}
for m in ("native", "expandable", "nocache", "shim", "pluggable", "pluggable-async"):
    p = os.path.join(out, f"torch-{m}.json")
    if os.path.exists(p) and os.path.getsize(p):
        runs[m] = json.loads(open(p).read().strip().splitlines()[-1])
ref = runs.get("nocache")
ok = ref is not None
print(f"{'mode':<11} {'step ms':>8} {'peak MiB':>9} {'what':<22} {'live MiB':>9} {'NVML MiB':>9} {'max |dloss| vs nocache':>24}")
for m, r in runs.items():
    if "pool_mapped_peak" in r:
        peak, what, live = r["pool_mapped_peak"], "pool mapped peak", r["pool_live_peak"]
    elif m in ("nocache", "pluggable-async"):
        peak, what, live = float("nan"), "(not tracked)", float("nan")
    else:
        peak, what, live = r["max_reserved"], "reserved peak", r["max_allocated"]
    d = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"])) if ref else float("nan")
    print(f"{m:<11} {r['step_ms']:>8.2f} {peak / 2**20:>9.1f} {what:<22} {live / 2**20:>9.1f} {r['nvml_peak'] / 2**20:>9.1f} {d:>24.3g}")
    if m in ("shim", "pluggable"):
        if not ref or r["losses"] != ref["losses"]:
            print(f"  {m}: loss curve differs from the no-caching run")
            ok = False
        if not r.get("pool_mallocs"):
            print(f"  {m}: the pool served nothing")
            ok = False
if ref:
    print("first/last loss:", ref["losses"][0], ref["losses"][-1], "card:", ref["card"])
sys.exit(0 if ok else 1)
EOF
}
step torch-compare torch_compare

# ---- 5: the laboratory cases ------------------------------------------------------------------
lab() {
	: >"$OUT/lab.json"
	for c in 8x16_then_4x32 holes_then_32 10_1_-10_4_11; do
		PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" \
			python3 "$ROOT/test/gpu/shim_lab.py" shim "$c" >>"$OUT/lab.json" || return 1
	done
	python3 "$ROOT/test/gpu/shim_lab.py" native >>"$OUT/lab.json" || return 1
	PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
		python3 "$ROOT/test/gpu/shim_lab.py" expandable >>"$OUT/lab.json" || return 1
	python3 - "$OUT/lab.json" <<'EOF'
import json, sys
ok = True
print(f"{'case':<16} {'mode':<11} {'live peak MiB':>14} {'allocator peak MiB':>19} {'NVML peak MiB':>14}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    peak = r.get("pool_mapped_peak", r.get("reserved_peak"))
    print(f"{r['case']:<16} {r['mode']:<11} {r['live_peak'] / 2**20:>14.0f} {peak / 2**20:>19.0f} {r['nvml_peak'] / 2**20:>14.0f}")
    if r["mode"] == "shim":
        page = r["page_size"]
        # peak device memory equals peak live bytes up to page rounding
        bound = r["live_peak"] + 4 * page
        if not (r["live_peak"] <= peak <= bound):
            print(f"  {r['case']}: pool peak {peak} outside [{r['live_peak']}, {bound}]")
            ok = False
sys.exit(0 if ok else 1)
EOF
}
step lab lab

# ---- 6: JAX -------------------------------------------------------------------------------------
jax_run() { # NAME MODE ENV...
	local name=$1 mode=$2
	shift 2
	env "$@" python3 "$ROOT/test/gpu/shim_jax.py" "$mode" "$JAX_STEPS" >"$OUT/$name.json" &&
		cut -c1-300 "$OUT/$name.json"
}
jax_compare() {
	python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
runs = {}
for n in ("jax-bfc", "jax-bfc-shim", "jax-platform-shim"):
    p = os.path.join(out, f"{n}.json")
    if os.path.exists(p) and os.path.getsize(p):
        runs[n] = json.loads(open(p).read().strip().splitlines()[-1])
ok = True
print(f"{'run':<18} {'step ms':>8} {'NVML peak MiB':>14} {'pool mapped MiB':>16} {'pool live MiB':>14} {'max rel dloss':>14}")
for n, r in runs.items():
    # XLA's numbers differ from process to process by some 1e-6 whatever
    # the allocator: every run compares with the plain BFC run.
    ref = runs.get("jax-bfc") if n.endswith("-shim") else None
    d = (max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ref["losses"])),
             default=float("inf")) if ref else float("nan"))
    mp, lp = r.get("pool_mapped_peak", float("nan")), r.get("pool_live_peak", float("nan"))
    print(f"{n:<18} {r['step_ms']:>8.2f} {r['nvml_peak'] / 2**20:>14.1f} {mp / 2**20:>16.1f} {lp / 2**20:>14.1f} {d:>14.3g}")
    if n.endswith("-shim"):
        if not ref:
            print(f"  {n}: no run without the shim to compare with")
            ok = False
        elif len(r["losses"]) != len(ref["losses"]) or not d <= 1e-4:
            print(f"  {n}: losses differ from the run without the shim")
            ok = False
        print(f"  {n}: the pool served {r.get('pool_mallocs', 0)} allocations; XLA made "
              f"{r.get('own_creates', '?')} handles of its own (test/gpu/shim_jax.py)")
if len(runs) < 3:
    print(f"only {len(runs)} of 3 JAX runs finished")
    ok = False
r = next(iter(runs.values()), None)
if r:
    print("jax", r["jax"], "on", r["card"])
sys.exit(0 if ok else 1)
EOF
}
if python3 -c "import jax; jax.devices('gpu')" >/dev/null 2>&1; then
	step jax-bfc jax_run jax-bfc bfc
	step jax-bfc-shim jax_run jax-bfc-shim bfc LD_PRELOAD="$LIB" EXPECT_POOL=1
	step jax-platform-shim jax_run jax-platform-shim platform LD_PRELOAD="$LIB" EXPECT_POOL=1
	step jax-compare jax_compare
elif [[ jax =~ $ONLY ]]; then
	say "== jax: skipped, python3 has no JAX with a GPU"
	RESULTS+=("skipped jax (python3 has no JAX with a GPU)")
fi

say ""
say "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F))"
awk '/^== /{n=$2} /^timing:/{print "  " n " " $0}' "$LOG" | tee -a "$OUT/summary.txt"
printf '%s\n' "${RESULTS[@]}" | tee -a "$LOG" "$OUT/summary.txt"
rm -rf "$W"
exit $FAILED
