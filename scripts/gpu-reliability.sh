#!/usr/bin/env bash
# gpu-reliability.sh — the reliability checks on a real GPU: out of
# memory for real (test/gpu/oom.cu) and the five-minute soak
# (test/gpu/soak.cu), each under LD_PRELOAD=libvpmm.so after a plain run of
# the same program, which shows that the program's own checks and
# tolerances hold on CUDA itself. Needs gcc, nvcc, python3 and nvidia-smi;
# no meson. Run from anywhere; results go to $OUT (default
# build-gpu/reliability): one log per run, the soak's vpmm-dump documents
# (dumps/), summary.txt.
#
#   build            libvpmm.so as gpu-check.sh's hot path builds it,
#                    vpmm-dump as gpu-dump.sh does, the programs with nvcc;
#                    oom twice: nvcc's default static runtime reaches the shim
#                    through the driver entry points (cuGetProcAddress),
#                    -cudart shared through the runtime hooks;
#   oom-plain        oom.cu without the shim (~10 s each oom run);
#   oom-shim         oom.cu, static runtime, under the shim, with vpmm-dump;
#   oom-shim-shared  the same, shared runtime;
#   soak-plain       soak.cu without the shim, PLAIN_SOAK seconds (10);
#   soak-shim        soak.cu under the shim, SOAK_DURATION seconds (300);
#   soak-dumps       test/gpu/dump_check.py on the soak's region maps (taken
#                    while it ran, and paused with the device idle).
# Wall time with the defaults: about 6 minutes (builds ~1, oom runs ~0.5,
# soaks 5.2). Every run has a time limit, so a hang still leaves a summary.
#
# Environment: OUT, SOAK_DURATION (or DURATION; seconds, default 300),
# PLAIN_SOAK (10), RELIAB_ONLY (a regex of run names, default all), CUDA_HOME
# (/usr/local/cuda), GPU_ARCH (sm_90). The programs' own knobs (SOAK_*,
# OOM_*) pass through; their meaning is in the programs' headers.
# Exit status: 0 when every run and check passed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu/reliability}
CUDA=${CUDA_HOME:-/usr/local/cuda}
ARCH=${GPU_ARCH:-sm_90}
SOAK=${SOAK_DURATION:-${DURATION:-300}}
PLAIN=${PLAIN_SOAK:-10}
ONLY=${RELIAB_ONLY:-.}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
export PATH=$CUDA/bin:$PATH PYTHONUNBUFFERED=1
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0
T0=$SECONDS
note() { echo "$*" | tee -a "$SUMMARY"; }
note "gpu-reliability $(date -u +%FT%H:%MZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# ---- build (no meson: the sources the meson.build files list) -----------------------
# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
LIB=$W/libvpmm.so
DUMP=$W/vpmm-dump
vpmm_build_lib "$LIB" >"$OUT/build-lib.log" 2>&1 &
vpmm_build_tool vpmm-dump "$DUMP" >"$OUT/build-dump.log" 2>&1 &
NVCC="nvcc -O2 -std=c++17 -arch=$ARCH"
($NVCC -o "$W/oom" "$ROOT/test/gpu/oom.cu") >"$OUT/build-oom.log" 2>&1 &
($NVCC -cudart shared -o "$W/oom-shared" "$ROOT/test/gpu/oom.cu") >"$OUT/build-oom-shared.log" 2>&1 &
($NVCC -o "$W/soak" "$ROOT/test/gpu/soak.cu") >"$OUT/build-soak.log" 2>&1 &
wait
built=1
for f in "$LIB" "$DUMP" "$W/oom" "$W/oom-shared" "$W/soak"; do
	[ -x "$f" ] || { built=0; note "FAIL build: $(basename "$f") not built (logs: $OUT/build-*.log)"; }
done
if [ $built = 0 ]; then
	cat "$OUT"/build-*.log | tail -40
	exit 1
fi
note "PASS build ($((SECONDS - T0)) s)"

# ---- runs ----------------------------------------------------------------------------
# run NAME LIMIT_S COMMAND...: output to $OUT/NAME.log (and the terminal);
# the "check NAME: STATUS details" lines go to the summary.
run() {
	local name=$1 limit=$2
	shift 2
	[[ $name =~ $ONLY ]] || return 0
	local t0=$SECONDS
	echo "== $name: $*"
	timeout -k 15 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
	local rc=${PIPESTATUS[0]}
	local status=PASS
	[ $rc -eq 0 ] || { status=FAIL; FAILED=1; }
	local why=""
	[ $rc -eq 124 ] || [ $rc -eq 137 ] && why=", time limit of $limit s"
	note "$status $name (exit $rc$why, $((SECONDS - t0)) s)"
	sed -n 's/^check \([^:]*\): \([A-Z]*\) /  \2 \1: /p' "$OUT/$name.log" | tee -a "$SUMMARY"
	# the program's own FAIL lines explain what no check line says
	grep '^FAIL' "$OUT/$name.log" | head -5 | sed 's/^/  /' | tee -a "$SUMMARY"
	grep -q '^\(check\|FAIL\) ' "$OUT/$name.log" || tail -5 "$OUT/$name.log" | sed 's/^/  | /' | tee -a "$SUMMARY"
}

SHIM=(env LD_PRELOAD="$LIB" EXPECT_POOL=1 VPMM_DUMP="$DUMP")
export CUDA_MODULE_LOADING=EAGER # every kernel loaded before the device fills

run oom-plain 180 "$W/oom"
run oom-shim 180 "${SHIM[@]}" "$W/oom"
run oom-shim-shared 180 "${SHIM[@]}" "$W/oom-shared"

run soak-plain $((PLAIN + 120)) env SOAK_DURATION="$PLAIN" "$W/soak"
rm -rf "$OUT/dumps"
mkdir -p "$OUT/dumps"
run soak-shim $((SOAK + 120)) "${SHIM[@]}" SOAK_DURATION="$SOAK" SOAK_DUMP_DIR="$OUT/dumps" "$W/soak"

# ---- the soak's region maps ---------------------------------------------------------------
if [[ soak-dumps =~ $ONLY ]] && [[ soak-shim =~ $ONLY ]]; then
	shopt -s nullglob
	during=("$OUT"/dumps/soak-run-*.json)
	quiet=("$OUT"/dumps/soak-quiet-*.json)
	shopt -u nullglob
	python3 "$ROOT/test/gpu/dump_check.py" "${during[@]}" >"$OUT/soak-dumps.log" 2>&1
	rc=$?
	python3 "$ROOT/test/gpu/dump_check.py" --quiet "${quiet[@]}" >>"$OUT/soak-dumps.log" 2>&1
	rc=$((rc | $?))
	if [ ${#during[@]} -ge 1 ] && [ ${#quiet[@]} -eq 2 ] && [ $rc -eq 0 ]; then
		note "PASS soak-dumps: ${#during[@]} maps taken while running and ${#quiet[@]} paused: tiled, gauges agree"
	else
		FAILED=1
		note "FAIL soak-dumps: ${#during[@]} maps while running, ${#quiet[@]} paused (2 expected), checker exit $rc"
	fi
	grep -E '^(ok|FAIL)' "$OUT/soak-dumps.log" | sed "s|$OUT/dumps/||; s/^/  /" | cut -c1-220 | tee -a "$SUMMARY"
	grep -E '^  ' "$OUT/soak-dumps.log" | head -10 | tee -a "$SUMMARY"
fi

note "gpu-reliability: $([ $FAILED = 0 ] && echo PASS || echo FAIL) in $((SECONDS - T0)) s"
exit $FAILED
