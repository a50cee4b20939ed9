#!/usr/bin/env bash
# gpu-bench.sh — the allocator comparisons in one go on a machine with a GPU:
# builds libvpmm.so and bench/hotpath without meson (the device machine has
# nvcc, PyTorch and CuPy but no meson or ninja), generates the workloads,
# replays each through every allocator, runs the hot path benchmarks, and
# prints one table of ratios last (bench/report.py).
#
# Environment (all optional):
#   OUT          where the logs go (default build-bench/out); the device tool
#                sets it and brings back: setup.log, hotpath.log, replay.txt,
#                replay.json, replay-children.log, table.md
#   BENCH_BUILD  build directory (default /tmp/vpmm-bench)
#   CUDA_HOME    CUDA toolkit (default /usr/local/cuda)
#   ALLOCS       comma-separated allocators for the replays (default: all)
#   ONLY         comma-separated workloads (default: all)
#   DEADLINE     seconds after which no new replay starts (default 280)
#   QUICK=1      fewer repetitions in the hot path benchmarks
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-bench/out}
B=${BENCH_BUILD:-/tmp/vpmm-bench}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
DEADLINE=${DEADLINE:-280}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$B/obj"
# Never let a benchmark turn on NVLink multicast on a shared host.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 VPMM_SOCKET=off CUDA_DEVICE_ORDER=PCI_BUS_ID

SETUP=$OUT/setup.log
: >"$SETUP"
say() { printf '==> %s\n' "$*" | tee -a "$SETUP"; }

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
VPMM_BUILD_CFLAGS=-g
# the allocator's objects for bench/hotpath.cu, with the flags of the library
read -r -a CFLAGS <<<"$(vpmm_build_cflags "$ROOT") -fPIC -Wno-unused-parameter"

# libvpmm.so as shim/meson.build makes it (scripts/gpu-build.sh). Prints the
# path, or nothing.
build_libvpmm() {
	if vpmm_build_lib "$B/libvpmm.so" >>"$SETUP" 2>&1; then
		if nm -D "$B/libvpmm.so" | grep -q ' T vpmm_torch_malloc$'; then
			echo "$B/libvpmm.so"
		else
			say "libvpmm.so built but exports no vpmm_torch_malloc"
		fi
	else
		say "libvpmm.so: build failed (see setup.log)"
	fi
}

build_hotpath() {
	local f objs=()
	for f in $(vpmm_sources "$ROOT" allocator); do
		gcc "${CFLAGS[@]}" -c "$f" -o "$B/obj/$(basename "$f" .c).o" >>"$SETUP" 2>&1 ||
			{ say "hotpath: $f does not compile"; return 1; }
		objs+=("$B/obj/$(basename "$f" .c).o")
	done
	"$CUDA_HOME/bin/nvcc" -O2 -std=c++17 -I"$ROOT/allocator" -I"$ROOT/include" bench/hotpath.cu \
		"${objs[@]}" -ldl -lpthread -o "$B/hotpath" >>"$SETUP" 2>&1 ||
		{ say "hotpath: nvcc failed (see setup.log)"; return 1; }
}

say "date $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
	tee -a "$SETUP"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' \
	>>"$SETUP" 2>&1
"$CUDA_HOME/bin/nvcc" --version | tail -n 1 >>"$SETUP" 2>&1

say "building libvpmm.so"
LIBVPMM=$(build_libvpmm)
say "libvpmm.so: ${LIBVPMM:-not available: the vpmm allocators are skipped}"
say "building bench/hotpath"
HOTPATH_OK=1
build_hotpath || HOTPATH_OK=0

say "generating workloads"
"$PY" bench/workloads.py --out "$B/workloads" 2>&1 | tee -a "$SETUP"

: >"$OUT/hotpath.log"
if ((HOTPATH_OK)); then
	say "hot path benchmarks"
	timeout 150 "$B/hotpath" ${QUICK:+--quick} 2>&1 | tee "$OUT/hotpath.log"
	say "hotpath exit ${PIPESTATUS[0]}"
fi

say "replays (one process per allocator and workload)"
: >"$OUT/replay-children.log"
matrix=(bench/replay_gpu.py matrix --workloads "$B/workloads" --out "$OUT/replay.json"
	--log "$OUT/replay-children.log" --deadline "$DEADLINE" --timeout 90)
[[ -n $LIBVPMM ]] && matrix+=(--libvpmm "$LIBVPMM")
[[ -n ${ALLOCS:-} ]] && matrix+=(--allocs "$ALLOCS")
[[ -n ${ONLY:-} ]] && matrix+=(--only "$ONLY")
"$PY" "${matrix[@]}" 2>&1 | tee "$OUT/replay.txt"

echo
echo "================ ratios ================"
"$PY" bench/report.py --replay "$OUT/replay.json" --hotpath "$OUT/hotpath.log" |
	tee "$OUT/table.md"
