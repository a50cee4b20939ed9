#!/usr/bin/env bash
# gpu-share.sh — the sharing checks on real GPUs: cudaIpc* between two
# processes (test/gpu/share.cu ipc), torch.multiprocessing sharing CUDA
# tensors (test/gpu/share_torch.py, no-caching mode and caching allocator),
# and peer access after a defragmentation (share.cu peer: needs 2 GPUs, says
# SKIP on one). Each runs without the shim (the driver's behaviour, the
# baseline) and with it (EXPECT_POOL=1: the pool must have served). Needs gcc,
# nvcc, python3 with torch; no meson. Results in $OUT (default
# build-gpu-share/): share.log and summary.txt. Exit 0 when every step passed.
#
# Environment: CUDA_HOME (default /usr/local/cuda), GPU_ARCH (sm_90),
# SHARE_ONLY (a regex of step names).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gpu-step.sh
. "$ROOT/scripts/gpu-step.sh"
vpmm_step_setup share
RESULTS=()

step() { # NAME COMMAND...
	local name=$1
	vpmm_step_run "$@" || return 0
	local rc=$STEP_RC t=$STEP_SECS
	local note=""
	grep -q '^SKIP' "$W/step.txt" && note=" (skipped: $(grep -m1 '^SKIP' "$W/step.txt"))"
	if [ "$rc" -eq 0 ]; then
		RESULTS+=("ok      $name ($t s)$note")
	else
		RESULTS+=("FAILED  $name (exit $rc, $t s)")
		FAILED=1
	fi
}

say "gpu-share: $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
VPMM_BUILD_CFLAGS=-g
build() {
	vpmm_build_lib "$W/libvpmm.so" &&
		nvcc -O2 -arch="$ARCH" -cudart shared -o "$W/share" "$ROOT/test/gpu/share.cu"
}
step build build
LIB=$W/libvpmm.so
if [ -f "$LIB" ]; then
	# Without the shim the driver's own IPC and peer access: the baseline.
	step ipc-native env SHIM_LIB="$LIB" "$W/share" ipc
	step ipc-shim env SHIM_LIB="$LIB" EXPECT_POOL=1 LD_PRELOAD="$LIB" "$W/share" ipc
	step torch-nocache-native env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 "$ROOT/test/gpu/share_torch.py"
	step torch-nocache-shim env EXPECT_POOL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" \
		python3 "$ROOT/test/gpu/share_torch.py"
	step torch-caching-shim env EXPECT_POOL=1 LD_PRELOAD="$LIB" python3 "$ROOT/test/gpu/share_torch.py"
	step peer-native "$W/share" peer
	step peer-shim env EXPECT_POOL=1 LD_PRELOAD="$LIB" "$W/share" peer
fi
printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
rm -rf "$W"
exit $FAILED
