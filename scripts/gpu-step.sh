# gpu-step.sh — sourced by the GPU check scripts (gpu-share.sh,
# gpu-graphs.sh, gpu-address.sh): their common set-up and the one way they
# run a step. Each script then words the step's outcome for its own summary.
#
#   vpmm_step_setup NAME
#     The set-up of the check script NAME (share, graphs, address), ROOT
#     set: OUT (default $ROOT/build-gpu-NAME), CUDA (CUDA_HOME, default
#     /usr/local/cuda), ARCH (GPU_ARCH, sm_90), ONLY (NAME_ONLY in
#     capitals, a regex of step names; default every step), W (a fresh
#     folder), LOG ($OUT/NAME.log, emptied), FAILED=0, nvcc on PATH and
#     Python unbuffered.
#
#   say TEXT...
#     echo to the terminal and $LOG.
#
#   vpmm_step_run NAME COMMAND...
#     Returns 1 without running when NAME does not match $ONLY. Else runs
#     COMMAND (a shell function as it is, anything else under a 300 s
#     timeout), its output into $W/step.txt and appended to $LOG, prints
#     its last STEP_TAIL lines (3; 0: none), and sets STEP_RC (its exit
#     status) and STEP_SECS.
# Needs: ONLY, W, LOG (vpmm_step_setup).

vpmm_step_setup() {
	local name=$1 only
	only=$(echo "$1" | tr '[:lower:]' '[:upper:]')_ONLY
	OUT=${OUT:-$ROOT/build-gpu-$name}
	CUDA=${CUDA_HOME:-/usr/local/cuda}
	ARCH=${GPU_ARCH:-sm_90}
	ONLY=${!only:-.}
	W=$(mktemp -d)
	mkdir -p "$OUT"
	LOG=$OUT/$name.log
	: >"$LOG"
	export PATH=$CUDA/bin:$PATH PYTHONUNBUFFERED=1
	FAILED=0
}

say() { echo "$*" | tee -a "$LOG"; }

vpmm_step_run() {
	local name=$1
	shift
	[[ $name =~ $ONLY ]] || return 1
	say "== $name: $*"
	local t0=$SECONDS
	if declare -F "$1" >/dev/null; then # timeout cannot run a function
		"$@" >"$W/step.txt" 2>&1
	else
		timeout 300 "$@" >"$W/step.txt" 2>&1
	fi
	STEP_RC=$?
	STEP_SECS=$((SECONDS - t0))
	cat "$W/step.txt" >>"$LOG"
	[ "${STEP_TAIL:-3}" -gt 0 ] && tail -n "${STEP_TAIL:-3}" "$W/step.txt"
	return 0
}
