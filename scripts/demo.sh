#!/usr/bin/env bash
# demo.sh — a first run that shows the pool at work, in under a minute.
#
# With a GPU (nvidia-smi -L lists one) and nvcc: builds examples/demo.cu and
# runs the design's scenario (+10, +1, -10, +4, +11 units on one stream,
# scaled to the free memory) through the CUDA pool, then through libvpmm
# (LD_PRELOAD), printing each run's peak device memory from NVML and, under
# libvpmm, vpmm-dump's map of the pool at the end.
# Without: scripts/demo_cpu.py replays the scenario and a serving-shaped
# trace through the pool with vpmm-replay, against a caching allocator's
# model.
#
# Uses the meson build (BUILD, default build/: build/tools/vpmm-replay,
# build/shim/libvpmm.so, build/tools/vpmm-dump); on a GPU machine without
# one, builds the library and vpmm-dump with scripts/gpu-build.sh.
# Environment: BUILD; OUT (what the demo writes, default
# ${TMPDIR:-/tmp}/vpmm-demo-$UID); VPMM_DEMO=cpu|gpu (default: as found);
# NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc); DRY_RUN=1
# says which path it takes and prints the commands instead of running them.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-$repo/build}
out=${OUT:-${TMPDIR:-/tmp}/vpmm-demo-$(id -u)}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
dry=${DRY_RUN:-0}

# Runs its arguments, or prints them (DRY_RUN=1).
run() {
	if [ "$dry" = 1 ]; then
		printf '+'
		printf ' %q' "$@"
		printf '\n'
	else
		"$@"
	fi
}

mode=${VPMM_DEMO:-}
if [ -z "$mode" ]; then
	if nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && [ -x "$nvcc" ]; then
		mode=gpu
	else
		mode=cpu
	fi
fi
case $mode in
cpu | gpu) ;;
*) echo "demo.sh: VPMM_DEMO=$mode: expected cpu or gpu" >&2; exit 2 ;;
esac
[ "$dry" = 1 ] && echo "demo.sh: the $mode path"
run mkdir -p "$out"

if [ "$mode" = cpu ]; then
	replay=$build/tools/vpmm-replay
	if [ "$dry" != 1 ] && [ ! -x "$replay" ]; then
		echo "demo.sh: $replay is not built: run scripts/install.sh, or" \
			"meson setup build && ninja -C build" >&2
		exit 2
	fi
	run python3 "$repo/scripts/demo_cpu.py" --replay "$replay" \
		--workloads "$repo/bench/workloads.py" --out "$out"
	exit 0
fi

lib=$build/shim/libvpmm.so
dump=$build/tools/vpmm-dump
if [ ! -e "$lib" ] || [ ! -e "$dump" ]; then
	# shellcheck source=scripts/gpu-build.sh
	. "$repo/scripts/gpu-build.sh"
	lib=$out/libvpmm.so
	dump=$out/vpmm-dump
	run vpmm_build_lib "$lib" "$repo"
	run vpmm_build_tool vpmm-dump "$dump" "$repo"
fi
run "$nvcc" -O2 -o "$out/demo" "$repo/examples/demo.cu" -ldl
[ "$dry" = 1 ] || echo "== the CUDA pool (cudaMallocAsync, freed memory kept)"
run "$out/demo"
[ "$dry" = 1 ] || echo "== libvpmm (LD_PRELOAD=$lib), then vpmm-dump --map"
run env LD_PRELOAD="$lib" VPMM_DEMO_DUMP="$dump" "$out/demo"
