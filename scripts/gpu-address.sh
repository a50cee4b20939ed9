#!/usr/bin/env bash
# gpu-address.sh — what pool memory answers about itself, and two GPUs, on
# real GPUs (parts address and multi of scripts/gpu-check.sh). Needs gcc,
# nvcc, python3 with torch (CuPy optional); no meson. Results in $OUT
# (default build-gpu-address/): address.log and summary.txt, one
# PASS/FAIL/SKIP line per step. Exit 0 when no step failed.
#
# PART=address (one GPU):
#   address-native, address-shim   test/gpu/address.cu without the shim (the
#       driver's answers, printed) and under it (EXPECT_POOL=1: the shim's
#       answers required: range and mapping, legacy IPC, handle refused,
#       freed memory, the default pool's attributes, a pool of the
#       program's own);
#   torch-async-native, torch-async-shim   test/gpu/address_torch.py:
#       PyTorch's backend:cudaMallocAsync memory_stats, reset, empty_cache.
# PART=multi (two GPUs; one SKIP line with fewer):
#   test/gpu/multi_torch.py: dist-native (PyTorch's own allocator, the
#   baseline), dist-preload (PYTORCH_NO_CUDA_MEMORY_CACHING=1),
#   dist-preload-nocumem (NCCL's buffers from the pool too, shared by the
#   shim's IPC), pluggable, register and register-legacy (the caching
#   allocator on pool memory, every segment registered with NCCL; legacy:
#   NCCL_LEGACY_CUDA_REGISTER=1; natively first, see legacy_register),
#   ncclmem (NCCL's own memory under the preload), graph-native and
#   graph-preload (collectives captured in a CUDA graph, on pool memory
#   under the preload, where NCCL registers captured buffers itself or
#   copies), peer-native and peer-preload.
# PART=all: both. Environment: CUDA_HOME (default /usr/local/cuda), GPU_ARCH
# (sm_90), ADDRESS_ONLY (a regex of step names).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/gpu-step.sh
. "$ROOT/scripts/gpu-step.sh"
vpmm_step_setup address
PART=${PART:-all}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

# step NAME COMMAND...: one PASS/FAIL/SKIP line in the summary (SKIP when the
# command said SKIP and nothing failed), its output in the log.
step() {
	STEP_TAIL=0 vpmm_step_run "$@" || return 0
	step_result "$1" "$STEP_RC" "$STEP_SECS"
}

# step_result NAME RC SECS: the summary's line for the step just run.
step_result() {
	local name=$1 rc=$2 t=$3
	grep -E '^(PASS|FAIL|SKIP)' "$W/step.txt" | tail -n 40
	if [ "$rc" -ne 0 ]; then
		echo "FAIL $name (exit $rc, $t s): $(grep -m1 -E '^FAIL' "$W/step.txt")" | tee -a "$SUMMARY"
		FAILED=1
	elif grep -q '^SKIP' "$W/step.txt"; then
		echo "SKIP $name: $(grep -m1 '^SKIP' "$W/step.txt")" | tee -a "$SUMMARY"
	else
		echo "PASS $name ($t s, $(grep -c '^PASS' "$W/step.txt") checks)" | tee -a "$SUMMARY"
	fi
}

say "gpu-address ($PART): $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
VPMM_BUILD_CFLAGS=-g
build() {
	vpmm_build_lib "$W/libvpmm.so" &&
		gcc -O2 -fPIC -shared -o "$W/libsegv_trace.so" "$ROOT/test/gpu/segv_trace.c" &&
		nvcc -O2 -arch="$ARCH" -cudart shared -o "$W/address" "$ROOT/test/gpu/address.cu" -lcuda
}
step build build
LIB=$W/libvpmm.so
cd "$ROOT/test/gpu" || exit 1

if [ -f "$LIB" ] && [[ $PART =~ ^(address|all)$ ]]; then
	step address-native "$W/address"
	step address-shim env EXPECT_POOL=1 LD_PRELOAD="$LIB" "$W/address"
	step torch-async-native python3 address_torch.py
	step torch-async-shim env EXPECT_POOL=1 LD_PRELOAD="$LIB" python3 address_torch.py
fi

# NCCL's legacy IPC registration (NCCL_LEGACY_CUDA_REGISTER=1), natively
# first: NCCL 2.28.9 with PyTorch 2.11 dies of SIGSEGV in ncclCommDestroy
# after every collective passed, on PyTorch's own memory too (the same
# stack, without libvpmm). Where native dies so, the preload's run is an
# XFAIL only if it died the same way (died_in_nccl) after as many passed
# collectives as native's, with no frame of libvpmm.so on the stack; where
# native ends cleanly, the preload must.

# The collective checks that passed in $W/step.txt (lines interleave).
collectives_passed() {
	grep -oE 'PASS register rank [01] [a-z_ ]+ round [0-9]+' "$W/step.txt" | wc -l
}

# Whether the step in $W/step.txt (exit status $1) failed no check and a
# rank died of SIGSEGV inside ncclCommDestroy, no frame of libvpmm.so on
# the native stack (test/gpu/segv_trace.c).
died_in_nccl() {
	[ "$1" -ne 0 ] && ! grep -q '^FAIL' "$W/step.txt" &&
		grep -q '^segv_trace: .* signal 11 ' "$W/step.txt" &&
		grep -q 'libnccl[^ ]*(ncclCommDestroy+' "$W/step.txt" &&
		! grep -q 'libvpmm\.so(' "$W/step.txt"
}

legacy_register() {
	local preload=$1 ncoll=0
	if STEP_TAIL=0 vpmm_step_run register-legacy-native env LD_PRELOAD="$T" \
		TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 NCCL_LEGACY_CUDA_REGISTER=1 \
		python3 multi_torch.py register; then
		if died_in_nccl "$STEP_RC" && [ "$(collectives_passed)" -gt 0 ]; then
			ncoll=$(collectives_passed)
			echo "XFAIL register-legacy-native (exit $STEP_RC, $STEP_SECS s): NCCL dies in ncclCommDestroy after $ncoll collective checks passed, without libvpmm" | tee -a "$SUMMARY"
		else
			step_result register-legacy-native "$STEP_RC" "$STEP_SECS"
		fi
	fi
	STEP_TAIL=0 vpmm_step_run register-legacy $preload NCCL_LEGACY_CUDA_REGISTER=1 \
		python3 multi_torch.py register || return 0
	if [ "$ncoll" -gt 0 ] && died_in_nccl "$STEP_RC" && [ "$(collectives_passed)" -eq "$ncoll" ]; then
		echo "XFAIL register-legacy (exit $STEP_RC, $STEP_SECS s): as natively, after $ncoll collective checks passed" | tee -a "$SUMMARY"
	else
		step_result register-legacy "$STEP_RC" "$STEP_SECS"
	fi
}

if [ -f "$LIB" ] && [[ $PART =~ ^(multi|all)$ ]]; then
	ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
	if [ "$ngpu" -lt 2 ]; then
		echo "SKIP multi: $ngpu GPU(s) here, 2 needed" | tee -a "$SUMMARY"
	else
		# every rank that dies of a signal prints its native stack
		# (test/gpu/segv_trace.c) and its Python one
		T=$W/libsegv_trace.so
		export PYTHONFAULTHANDLER=1
		P="env PYTORCH_NO_CUDA_MEMORY_CACHING=1 EXPECT_POOL=1 LD_PRELOAD=$LIB:$T"
		step dist-native python3 multi_torch.py dist
		step dist-preload $P python3 multi_torch.py dist
		step dist-preload-nocumem $P NCCL_CUMEM_ENABLE=0 python3 multi_torch.py dist
		step pluggable env EXPECT_POOL=1 LD_PRELOAD="$T" VPMM_LIB="$LIB" python3 multi_torch.py pluggable
		R="env EXPECT_POOL=1 LD_PRELOAD=$LIB:$T TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG"
		step register $R python3 multi_torch.py register
		legacy_register "$R"
		step ncclmem env LD_PRELOAD="$LIB:$T" python3 multi_torch.py ncclmem
		step graph-native env LD_PRELOAD="$T" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG \
			python3 multi_torch.py graph
		step graph-preload env EXPECT_POOL=1 LD_PRELOAD="$LIB:$T" NCCL_DEBUG=INFO \
			NCCL_DEBUG_SUBSYS=REG python3 multi_torch.py graph
		step peer-native python3 multi_torch.py peer
		step peer-preload $P python3 multi_torch.py peer
		# What NCCL said about registering pool memory (not a check: the
		# copy path is as right as zero-copy).
		grep -E 'IPC (register|reuse)|legacy|Skipping registration|register comm|egister.*[Gg]raph|[Gg]raph.*egister' "$LOG" |
			sort | uniq -c | sort -rn | head -n 14 | sed 's/^/  nccl: /' | tee -a "$SUMMARY"
		# A native stack through libvpmm.so: its frames as functions and lines.
		grep -E '^segv_trace: ' "$LOG" | head -n 4 | sed 's/^/  /' | tee -a "$SUMMARY"
		grep -oE 'libvpmm\.so\(\+0x[0-9a-f]+\)' "$LOG" | grep -oE '0x[0-9a-f]+' | head -n 24 |
			addr2line -f -i -p -e "$LIB" | sed 's/^/  libvpmm frame: /' | tee -a "$SUMMARY"
		grep -oE 'libvpmm\.so\([A-Za-z_][A-Za-z0-9_]*\+0x[0-9a-f]+\)' "$LOG" | head -n 24 |
			sed 's/^/  libvpmm frame: /' | tee -a "$SUMMARY"
	fi
fi
rm -rf "$W"
exit $FAILED
