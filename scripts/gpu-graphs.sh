#!/usr/bin/env bash
# gpu-graphs.sh — CUDA graphs with the pool, on a real GPU: stream capture
# around pool memory, each program without the shim (the driver's
# behaviour, the baseline) and with it (EXPECT_POOL=1: the pool must have
# served, and deferred the frees the capture forbids). Needs gcc, nvcc,
# python3 with torch; no meson. Results in $OUT (default build-gpu-graphs/):
# graphs.log (everything) and summary.txt (one PASS, FAIL or SKIP line per
# check). Exit 0 when every step passed.
#
#   1. test/gpu/graphs.cu built with the shared runtime (the runtime hooks)
#      and with the static one (the driver's entry points only): plainly,
#      then under the preload;
#   2. test/gpu/graphs_torch.py: torch.cuda.graph with pool tensors freed
#      inside and outside the capture, and torch.compile(mode=
#      "reduce-overhead"), preloaded with PYTORCH_NO_CUDA_MEMORY_CACHING=1,
#      through CUDAPluggableAllocator (with torch.compile), and preloaded
#      under PyTorch's caching allocator (with torch.compile).
#
# Environment: CUDA_HOME (default /usr/local/cuda), GPU_ARCH (sm_90),
# GRAPHS_ONLY (a regex of step names).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gpu-step.sh
. "$ROOT/scripts/gpu-step.sh"
vpmm_step_setup graphs
RESULTS=()

# step NAME COMMAND...: one PASS or FAIL line for the step, and under it
# the PASS/FAIL/SKIP lines the command printed itself (graphs_torch.py's).
step() {
	local name=$1
	vpmm_step_run "$@" || return 0
	local rc=$STEP_RC t=$STEP_SECS
	if [ "$rc" -eq 0 ]; then
		RESULTS+=("PASS    $name ($t s)")
	else
		RESULTS+=("FAIL    $name (exit $rc, $t s): $(grep -m1 -E '^FAIL' "$W/step.txt" | cut -c1-160)")
		FAILED=1
	fi
	while IFS= read -r line; do
		RESULTS+=("          $line")
	done < <(grep -E '^(PASS|FAIL|SKIP) ' "$W/step.txt" | cut -c1-200)
}

say "gpu-graphs: $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
VPMM_BUILD_CFLAGS=-g
build() {
	vpmm_build_lib "$W/libvpmm.so" &&
		nvcc -O2 -arch="$ARCH" -cudart shared -I "$ROOT/include" -o "$W/graphs_shared" \
			"$ROOT/test/gpu/graphs.cu" &&
		nvcc -O2 -arch="$ARCH" -I "$ROOT/include" -o "$W/graphs_static" "$ROOT/test/gpu/graphs.cu"
}
step build build
LIB=$W/libvpmm.so
if [ -f "$LIB" ]; then
	step cuda-shared-plain "$W/graphs_shared"
	step cuda-shared-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/graphs_shared"
	step cuda-static-plain "$W/graphs_static"
	step cuda-static-shim env LD_PRELOAD="$LIB" EXPECT_POOL=1 "$W/graphs_static"
	G=$ROOT/test/gpu/graphs_torch.py
	step torch-shim env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" python3 "$G" shim
	step torch-pluggable env VPMM_LIB="$LIB" python3 "$G" pluggable
	step torch-caching-shim env LD_PRELOAD="$LIB" python3 "$G" caching
fi
printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
rm -rf "$W"
exit $FAILED
