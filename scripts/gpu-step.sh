# gpu-step.sh — sourced by the GPU check scripts (gpu-share.sh,
# gpu-graphs.sh, gpu-address.sh): the one way they run a step. Each script
# then words the step's outcome for its own summary.
#
#   vpmm_step_run NAME COMMAND...
#     Returns 1 without running when NAME does not match $ONLY. Else runs
#     COMMAND (a shell function as it is, anything else under a 300 s
#     timeout), its output into $W/step.txt and appended to $LOG, prints
#     its last STEP_TAIL lines (3; 0: none), and sets STEP_RC (its exit
#     status) and STEP_SECS.
# Needs: ONLY, W, LOG, and say() (echo to the terminal and $LOG).

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
