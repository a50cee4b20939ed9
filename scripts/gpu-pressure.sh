#!/usr/bin/env bash
# gpu-pressure.sh — the benchmark replays under memory pressure from a second
# process, what users meet (another job, a KV cache sized from free memory)
# and the only way to reach the driver's own out-of-memory path under an
# allocator. test/gpu/hold.cu holds all the device's memory but what each
# replay should need; bench/pressure.py runs the replays (bench/replay_gpu.py,
# one process each) under it and classifies each: completed, oom (a clean
# out-of-memory error), error (another error the replay reported), crash (a
# signal or an exit without a result), hang (killed at the time limit).
# Builds libvpmm.so (scripts/gpu-build.sh) and the holder with nvcc; needs
# python3 (torch for the torch allocators), nvidia-smi; no meson.
#
# MODES (default "pressure"; SOAK=1 means "soak"; "pressure soak" runs both
# after one build):
#   pressure  every workload x PRESSURE_ALLOCS twice: alone (the holder holds
#             nothing), then with the holder leaving MARGIN x the workload's
#             peak live + the replay's own set-up + PRESSURE_ALLOWANCE free.
#             The set-up (the process's context, streams and allocator, before
#             its first allocation: NVML's used then against NVML's used
#             before its context) is measured by its run alone, per allocator
#             and workload; a few hundred MiB, the CUDA context most of it.
#             The allowance (16 MiB) covers what that measure cannot: the
#             set-up's spread between two processes, and the driver's own
#             bookkeeping (page tables) for the replay's mappings, which every
#             allocator pays alike; the holder stops within 2 MiB above what
#             it is asked to leave, never under. Each run records its
#             effective margin, (the holder's free - its own set-up) / peak
#             live. Table: outcome, call time, that time over the CUDA
#             pool's alone, peak used / peak live.
#   soak      SOAK_MARGINS x SOAK_VPMM_SETS x SOAK_ALLOCS x every workload,
#             traces cut to SOAK_MAX_OPS operations, in a seeded shuffled
#             order until SOAK_DEADLINE (280 planned; about 1 s each, so the
#             deadline normally leaves some out; any prefix covers every
#             margin, setting, allocator and workload). One holder for all,
#             told before each run what to leave. Table: completed / oom /
#             error+crash+hang counts; every bad run's signal and last lines
#             of stderr in soak-crashes.log.
#
# Environment (all optional):
#   OUT                 results (default build-gpu/pressure); at most 8 files:
#                       log.txt (all this prints), build.log, runs.log (every
#                       replay's output, the holder's stderr), pressure.json,
#                       pressure.md, soak.json, soak.md, soak-crashes.log
#   SEED (11)           workloads.py's seed; LAB_SCALE (4): the laboratory
#                       cases' sizes x4 (so that the allowance does not dwarf
#                       a 64 MiB case); ONLY: comma-separated workloads
#   PRESSURE_ALLOCS     cuda_pool,torch_native,torch_expandable,vpmm_torch,vpmm_preload
#   MARGIN (1.02)  PRESSURE_ALLOWANCE (16M; also the soak's)
#   PRESSURE_DEADLINE (220 s: no replay starts after it)  PRESSURE_TIMEOUT
#                       (60 s a replay)  PRESSURE_MAX_OPS (0: whole traces)
#   SOAK_ALLOCS (vpmm_preload,vpmm_torch)  SOAK_MARGINS (1.00,1.01,1.02,1.05,1.10)
#   SOAK_VPMM_SETS      ';'-separated sets of ','-separated VPMM_NAME=VALUE,
#                       "default" for none (default: default;
#                       VPMM_GROWTH_SPLIT=1; VPMM_GROWTH_SPLIT=0,VPMM_HANDLE_SIZE=2M;
#                       VPMM_REMAP=always)
#   SOAK_MAX_OPS (2000)  SOAK_DEADLINE (200 s)  SOAK_TIMEOUT (30 s)
#   CUDA_HOME (/usr/local/cuda)  PYTHON (python3)
#   BASE                another revision's sources (untracked, e.g. exp-old/,
#                       from `git archive REV allocator shim tools
#                       meson.build | tar -x -C exp-old`, with include too
#                       where REV has it): its libvpmm.so
#                       is built too, and base:vpmm_preload (that library
#                       through the preload) joins the pressure allocators
#                       after vpmm_preload, under the same holder
#   DRY_RUN=1           builds nothing and runs nothing: prints the build
#                       commands, then every holder adjustment and replay
#                       command (the set-up taken as 0); needs no GPU
#   FAKE_GPU=1          a check of this script without a GPU: the holder
#                       simulated (pressure.py fake-hold), the replays dry
#                       (replay_gpu.py's dry allocator, its capacity the
#                       holder's free memory); the tables say FAKE
#
# Wall time with the defaults, estimated from gpu-bench.sh's replays (one to
# a few seconds a process, the torch ones longer for the import; every
# record keeps its process_s to check): build ~15 s; pressure 2-4 min for its
# 70 replays, never past build + PRESSURE_DEADLINE + PRESSURE_TIMEOUT (~5
# min); soak ~4 min (calibration, then runs until SOAK_DEADLINE, at most
# SOAK_TIMEOUT more). Both in one 10-minute device call: lower the deadlines
# (PRESSURE_DEADLINE=180 SOAK_DEADLINE=150).
#
# The holder never outlives a run of this script: it dies with
# bench/pressure.py (PR_SET_PDEATHSIG, and it exits when its stdin closes),
# which gives it back when a command ends or is signalled; the trap below
# signals pressure.py and then kills the holder by its recorded id if it is
# somehow still there. Exit status: 0 when every mode ran to its end
# (whatever the outcomes), 1 otherwise.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu/pressure}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PYTHON:-python3}
MODES=${MODES:-pressure}
[[ ${SOAK:-0} = 1 ]] && MODES=soak
SEED=${SEED:-11}
LAB_SCALE=${LAB_SCALE:-4}
DRY_RUN=${DRY_RUN:-0}
FAKE_GPU=${FAKE_GPU:-0}
mkdir -p "$OUT"
W=$(mktemp -d)
HOLD_PID_FILE=$W/hold.pid
DRIVER_PID=

# shellcheck disable=SC2317  # called by the trap
cleanup() {
	local p
	trap - EXIT INT TERM HUP
	if [[ -n $DRIVER_PID ]] && kill -0 "$DRIVER_PID" 2>/dev/null; then
		kill -TERM "$DRIVER_PID" 2>/dev/null
		wait "$DRIVER_PID" 2>/dev/null
	fi
	# The tables of a run cut short, from what its JSON kept.
	for m in $MODES; do
		if [[ -s $OUT/$m.json && ! -s $OUT/$m.md && $DRY_RUN != 1 ]]; then
			"$PY" bench/pressure_report.py "$OUT/$m.json" >"$OUT/$m.md" 2>/dev/null
		fi
	done
	if [[ -s $HOLD_PID_FILE ]]; then
		p=$(cat "$HOLD_PID_FILE")
		if [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null; then
			echo "gpu-pressure: the holder $p was still there: killed"
			kill -KILL "$p" 2>/dev/null
		fi
	fi
	rm -rf "$W"
	# Let tee write out the last lines before the caller reads log.txt.
	if [[ -n ${TEE_PID:-} ]]; then
		exec >&- 2>&-
		for _ in $(seq 1 40); do
			kill -0 "$TEE_PID" 2>/dev/null || break
			sleep 0.05
		done
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

rm -f "$OUT"/{log.txt,build.log,runs.log,pressure.json,pressure.md,soak.json,soak.md,soak-crashes.log}
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1 VPMM_SOCKET=off
# Never let a replay turn on NVLink multicast on a shared host.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

say() { printf '==> %s\n' "$*"; }
# run_or_show CMD...: runs it, or prints it under DRY_RUN=1.
run_or_show() {
	if [[ $DRY_RUN = 1 ]]; then
		printf 'would run:'
		printf ' %q' "$@"
		printf '\n'
	else
		"$@"
	fi
}

for m in $MODES; do
	[[ $m = pressure || $m = soak ]] || { say "MODES: '$m' is neither pressure nor soak"; exit 2; }
done

# ---- what runs where ---------------------------------------------------------------
REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) || REV=""
if [[ -n $REV ]]; then
	git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || REV="$REV+changes"
else
	REV="unknown (no .git)"
fi
CARD="no GPU"
if [[ $FAKE_GPU = 1 ]]; then
	CARD="fake"
elif command -v nvidia-smi >/dev/null; then
	CARD=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0 2>/dev/null | head -1)
	CARD=${CARD:-no GPU}
	mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i 0 2>/dev/null | head -1)
	# A second process needs a context of its own on the device.
	if [[ $mode = Exclusive_Process || $mode = Prohibited ]] && [[ $DRY_RUN != 1 ]]; then
		say "the GPU's compute mode is $mode: a second process cannot share it; nothing run"
		exit 1
	fi
	others=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null)
	[[ -n $others ]] && say "other processes on the GPU (their memory changes every figure): $others"
elif [[ $DRY_RUN != 1 ]]; then
	say "no nvidia-smi: this needs a GPU (DRY_RUN=1 or FAKE_GPU=1 without one)"
	exit 1
fi
say "gpu-pressure $(date -u +%Y-%m-%dT%H:%M:%SZ) on $CARD, tree $REV, modes: $MODES, seed $SEED"

# ---- build --------------------------------------------------------------------------------
LIB=$W/libvpmm.so
HOLD=$W/hold
if [[ $FAKE_GPU = 1 ]]; then
	LIB=""
	HOLD="(simulated)"
else
	# shellcheck source=scripts/gpu-build.sh
	. "$ROOT/scripts/gpu-build.sh"
	if [[ $DRY_RUN = 1 ]]; then
		say "would build $LIB with scripts/gpu-build.sh's vpmm_build_lib"
		if [[ -n ${BASE:-} ]]; then
			BASE_LIB=$W/base/libvpmm.so
			say "would build $BASE_LIB from BASE=$BASE"
		fi
		run_or_show "$CUDA_HOME/bin/nvcc" -O2 -std=c++17 -o "$HOLD" test/gpu/hold.cu
	else
		say "building libvpmm.so and the holder"
		t0=$SECONDS
		VPMM_BUILD_CFLAGS=-g vpmm_build_lib "$LIB" >"$OUT/build.log" 2>&1 &
		lib_pid=$!
		"$CUDA_HOME/bin/nvcc" -O2 -std=c++17 -o "$HOLD" test/gpu/hold.cu >>"$OUT/build.log" 2>&1
		hold_rc=$?
		wait "$lib_pid"
		lib_rc=$?
		say "built in $((SECONDS - t0)) s: libvpmm.so exit $lib_rc, hold exit $hold_rc"
		if [[ $hold_rc != 0 || ! -x $HOLD ]]; then
			tail -20 "$OUT/build.log"
			say "the holder did not build (build.log): nothing run"
			exit 1
		fi
		if [[ $lib_rc != 0 || ! -f $LIB ]] || ! nm -D "$LIB" | grep -q ' T vpmm_torch_malloc$'; then
			tail -20 "$OUT/build.log"
			say "libvpmm.so did not build (build.log): the vpmm allocators are left out"
			LIB=""
		fi
		if [[ -n ${BASE:-} ]]; then
			BASE_LIB=$W/base/libvpmm.so
			mkdir -p "$W/base"
			if ! vpmm_build_lib "$BASE_LIB" "$(cd "$BASE" && pwd)" >>"$OUT/build.log" 2>&1; then
				tail -20 "$OUT/build.log"
				say "BASE=$BASE did not build (build.log): nothing run"
				exit 1
			fi
			say "built BASE=$BASE's libvpmm.so"
		fi
	fi
fi

# ---- workloads (CPU, needed by every mode, the dry run included) ---------------------------
WL=$W/workloads
wl=("$PY" bench/workloads.py --out "$WL" --seed "$SEED" --lab-scale "$LAB_SCALE")
[[ -n ${ONLY:-} ]] && wl+=(--only "$ONLY")
if ! "${wl[@]}"; then
	say "workloads.py failed: nothing run"
	exit 1
fi

# The allocator list without the vpmm ones when libvpmm.so is missing.
allocs_for() {
	local list=$1 out="" a
	for a in ${list//,/ }; do
		if [[ $a = vpmm* && -z $LIB && $FAKE_GPU != 1 && $DRY_RUN != 1 ]]; then
			say "$a left out: no libvpmm.so" >&2
			continue
		fi
		out+="${out:+,}$a"
	done
	echo "$out"
}

# ---- the modes -------------------------------------------------------------------------------
# drive MODE ARGS...: bench/pressure.py in the background (so that a signal
# reaches the trap at once), then its table.
FAILED=0
drive() {
	local mode=$1
	shift
	local args=("$PY" bench/pressure.py "$mode" --workloads "$WL" --hold "$HOLD"
		--out "$OUT/$mode.json" --log "$OUT/runs.log" --pid-file "$HOLD_PID_FILE"
		--seed "$SEED" --device "$CARD" --rev "$REV"
		--allowance "${PRESSURE_ALLOWANCE:-16M}" "$@")
	[[ -n $LIB ]] && args+=(--libvpmm "$LIB")
	[[ -n ${BASE_LIB:-} ]] && args+=(--base-libvpmm "$BASE_LIB")
	[[ -n ${ONLY:-} ]] && args+=(--only "$ONLY")
	[[ $DRY_RUN = 1 ]] && args+=(--dry-run)
	[[ $FAKE_GPU = 1 ]] && args+=(--fake)
	if [[ -n ${FAKE_FAULTS:-} ]]; then # FAKE_GPU's test knob: ALLOC:KIND:N,...
		local f
		for f in ${FAKE_FAULTS//,/ }; do args+=(--fake-fault "$f"); done
	fi
	say "$mode: ${args[*]}"
	local t0=$SECONDS rc
	"${args[@]}" &
	DRIVER_PID=$!
	wait "$DRIVER_PID"
	rc=$?
	DRIVER_PID=
	say "$mode: exit $rc in $((SECONDS - t0)) s"
	[[ $rc = 0 ]] || FAILED=1
	if [[ $DRY_RUN != 1 && -f $OUT/$mode.json ]]; then
		"$PY" bench/pressure_report.py "$OUT/$mode.json" >"$OUT/$mode.md" || FAILED=1
	fi
}

for m in $MODES; do
	if [[ $m = pressure ]]; then
		allocs=$(allocs_for "${PRESSURE_ALLOCS:-cuda_pool,torch_native,torch_expandable,vpmm_torch,vpmm_preload}")
		if [[ -n ${BASE_LIB:-} && ,$allocs, != *,base:vpmm_preload,* ]]; then
			allocs=$(sed 's/\(^\|,\)vpmm_preload\(,\|$\)/\1vpmm_preload,base:vpmm_preload\2/' <<<"$allocs")
			[[ ,$allocs, = *,base:vpmm_preload,* ]] || allocs+=,base:vpmm_preload
		fi
		[[ -z $allocs ]] && { say "pressure: no allocator left"; FAILED=1; continue; }
		drive pressure --allocs "$allocs" --margin "${MARGIN:-1.02}" \
			--deadline "${PRESSURE_DEADLINE:-220}" --timeout "${PRESSURE_TIMEOUT:-60}" \
			--max-ops "${PRESSURE_MAX_OPS:-0}"
	else
		allocs=$(allocs_for "${SOAK_ALLOCS:-vpmm_preload,vpmm_torch}")
		[[ -z $allocs ]] && { say "soak: no allocator left"; FAILED=1; continue; }
		drive soak --allocs "$allocs" \
			--margins "${SOAK_MARGINS:-1.00,1.01,1.02,1.05,1.10}" \
			--vpmm-sets "${SOAK_VPMM_SETS:-default;VPMM_GROWTH_SPLIT=1;VPMM_GROWTH_SPLIT=0,VPMM_HANDLE_SIZE=2M;VPMM_REMAP=always}" \
			--max-ops "${SOAK_MAX_OPS:-2000}" --deadline "${SOAK_DEADLINE:-200}" \
			--timeout "${SOAK_TIMEOUT:-30}" --crash-log "$OUT/soak-crashes.log"
	fi
done

# ---- the tables, last --------------------------------------------------------------------------
for m in $MODES; do
	if [[ -s $OUT/$m.md ]]; then
		echo
		cat "$OUT/$m.md"
	fi
done
exit $FAILED
