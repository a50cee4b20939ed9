#!/usr/bin/env bash
# gpu-check.sh — everything that needs a GPU, in one call of the device tool:
# the shim's checks (scripts/gpu-shim.sh: CUDA C static and shared, memcheck,
# CuPy, PyTorch training, the laboratory cases, JAX), vpmm-dump
# against a PyTorch process (scripts/gpu-dump.sh, when present), the hot path
# through the shim against the CUDA pool (bench/shim_hotpath.cu), the
# sharing checks (scripts/gpu-share.sh; peers need 2 GPUs), out-of-memory and
# soak checks (scripts/gpu-reliability.sh; about 60 s with the 40 s soak of
# these defaults, 6 minutes with its own 300 s), what the driver's calls cost
# (bench/vmm_costs.cu, bench/driver_queries.cu, a few seconds), synchronous
# frees over many non-blocking streams, the fences against synchronising
# (bench/fence_streams.py: part fences, about 4 minutes, 6 with
# FENCE_BASE), the allocator
# comparisons (scripts/gpu-bench.sh), and the replays under memory pressure
# from a second process (scripts/gpu-pressure.sh: part pressure, every
# workload x allocator alone and under a process holding all but 1.02 x its
# peak live, about 4-5 minutes; part soak, the vpmm allocators under margins
# 1.00-1.10 x VPMM_* settings, about 4 minutes; both share one build when
# both are asked for), CUDA graphs with the pool (scripts/gpu-graphs.sh:
# part graphs, stream capture in CUDA C and PyTorch, torch.compile's
# reduce-overhead mode; not in the default, a call of its own), and what
# pool memory answers about itself (scripts/gpu-address.sh: part address
# on one GPU, part multi with torch.distributed over NCCL and peer copies
# on two, a SKIP line with fewer). Prints a short table last.
#
# The device tool brings back at most 8 files from $OUT: the logs go into one
# archive, $OUT/logs.tgz, beside summary.txt, table.md, and pressure.md and
# soak.md when those parts ran.
#
# Environment: OUT (default build-gpu), PARTS (a regex of parts to run:
# shim|dump|python|hotpath|share|reliab|costs|fences|step|capacity|bench|pressure|
# soak|graphs|address|multi; "all" for every part; the default is
# shim|dump|share|reliab|bench), SHIM_STEPS (100), SHIM_JAX_STEPS (30),
# SOAK_DURATION (reliab, 40 s), STEP_ROUNDS (1),
# STEP_MODES (pluggable, pluggable with VPMM_GROWTH_SPLIT=1, and shim: the
# preload without caching, compared with pluggable; see gpu-torch-step.sh,
# whose BASE, PAIRED and STEP_TRACE pass through the environment: on two
# GPUs, PAIRED=1 BASE=pluggable STEP_MODES=shim times the two side by side),
# DEADLINE (bench, 170 s), CAPACITY_BUDGET (capacity: what the second
# process leaves free, 12G; bench/capacity.py), CAPACITY_TRIES (its tries
# an allocator at most, 10), CAPACITY_MODES (its allocators, all four),
# CAPACITY_START (native's first batch, 16), CAPACITY_CEILING (the
# largest batch tried, 0: none), CAPACITY_ROUNDS (the alternated
# runs at the common batch, 3; a run takes about 15 s on an H200, so the
# defaults' 4 x 10 tries and 3 x 4 runs pass a 10-minute call: fewer tries
# or modes there), CAPACITY_TIMED (1: the time inside the pluggable
# allocator's and the preload's calls, a step), FENCE_ROUNDS (fences: 2),
# FENCE_CONFIGS (its SIDE:EXTRA:DIM list, the part's comment), FENCE_STEPS
# (60), FENCE_BASE (another revision's tree to run beside this one's);
# pressure and soak read gpu-pressure.sh's own
# (SEED, MARGIN, PRESSURE_DEADLINE, SOAK_DEADLINE, ...: its header).
#
# All the parts together do not fit one 10-minute device call. On an H200
# (2026-11-26, 22:10-22:33 UTC) the parts took: shim 216-222 s (85 s of it
# JAX), dump 22 s, share 33-38 s, reliab 60 s, step 42 s, bench 169 s,
# hotpath and costs together over 50 s: the whole ran past 600 s twice. The
# default runs every test and the table (about 510 s by those figures);
# PARTS='hotpath|costs|step' is a second call, PARTS=pressure a third and
# PARTS=soak a fourth (or both in one call with PRESSURE_DEADLINE=180
# SOAK_DEADLINE=150); PARTS='address|multi' another (on two GPUs; a few
# minutes, mostly NCCL's start-up). The figures in docs/ come from longer runs of single
# parts: SOAK_DURATION=300 PARTS=reliab, STEP_ROUNDS=4 PARTS=step.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu}
PARTS=${PARTS:-shim|dump|share|reliab|bench}
[ "$PARTS" = all ] && PARTS=.
CUDA=${CUDA_HOME:-/usr/local/cuda}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/logs"
export PATH=$CUDA/bin:$PATH PYTHONUNBUFFERED=1
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
card=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
note "gpu-check $(date -u +%FT%H:%MZ) on ${card:-no GPU}"

part() { [[ $1 =~ $PARTS ]]; }

if part shim; then
	t0=$SECONDS
	OUT=$W/logs/shim SHIM_STEPS=${SHIM_STEPS:-100} SHIM_JAX_STEPS=${SHIM_JAX_STEPS:-30} bash "$ROOT/scripts/gpu-shim.sh" >"$W/logs/shim.txt" 2>&1
	rc=$?
	note "shim checks: exit $rc ($((SECONDS - t0)) s)"
	sed 's/^/  /' "$W/logs/shim/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

if part dump && [ -f "$ROOT/scripts/gpu-dump.sh" ]; then
	t0=$SECONDS
	OUT=$W/logs/dump bash "$ROOT/scripts/gpu-dump.sh" >"$W/logs/dump.txt" 2>&1
	note "vpmm-dump on the GPU: exit $? ($((SECONDS - t0)) s)"
	tail -n 5 "$W/logs/dump.txt" | sed 's/^/  /' | tee -a "$SUMMARY"
fi

if part python; then
	t0=$SECONDS
	OUT=$W/logs/python bash "$ROOT/scripts/gpu-python.sh" >"$W/logs/python.txt" 2>&1
	note "the Python package with PyTorch (scripts/gpu-python.sh): exit $? ($((SECONDS - t0)) s)"
	tail -n 12 "$W/logs/python.txt" | sed 's/^/  /' | tee -a "$SUMMARY"
fi

if part hotpath; then
	# The same program twice: the CUDA pool, then libvpmm under LD_PRELOAD.
	lib=$W/libvpmm.so
	# shellcheck source=scripts/gpu-build.sh
	. "$ROOT/scripts/gpu-build.sh"
	if vpmm_build_lib "$lib" >"$W/logs/hotpath-build.txt" 2>&1 &&
		nvcc -O2 -std=c++17 -o "$W/shim_hotpath" "$ROOT/bench/shim_hotpath.cu" \
			>>"$W/logs/hotpath-build.txt" 2>&1; then
		VPMM_SOCKET=off "$W/shim_hotpath" >"$W/logs/hotpath-plain.txt" 2>&1
		VPMM_SOCKET=off LD_PRELOAD="$lib" "$W/shim_hotpath" >"$W/logs/hotpath-vpmm.txt" 2>&1
		note "hot path through the shim (ns per malloc+free pair, one thread; pairs/s, 8 threads over 1, own streams, steady state):"
		join <(awk '/^case/{print $2"/"$3, $4, $5, ($6 ? $6 : 0)}' "$W/logs/hotpath-plain.txt" | sort) \
			<(awk '/^case/{print $2"/"$3, $4, $5, ($6 ? $6 : 0)}' "$W/logs/hotpath-vpmm.txt" | sort) |
			awk '{printf "  %-16s cuda %8.1f ns  vpmm %8.1f ns  ratio %.2f", $1, $2, $5, $5/$2;
			      if ($4 > 0 && $7 > 0) printf "   8 threads: cuda %.2g/s (%.2fx one) vpmm %.2g/s (%.2fx one)", $3, $3/$4, $6, $6/$7;
			      printf "\n"}' |
			tee -a "$SUMMARY"
	else
		note "hot path: build failed (logs/hotpath-build.txt)"
	fi
fi

if part share; then
	t0=$SECONDS
	OUT=$W/logs/share bash "$ROOT/scripts/gpu-share.sh" >"$W/logs/share.txt" 2>&1
	note "sharing (ipc, torch.multiprocessing, peers): exit $? ($((SECONDS - t0)) s)"
	sed 's/^/  /' "$W/logs/share/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

if part graphs; then
	t0=$SECONDS
	OUT=$W/logs/graphs bash "$ROOT/scripts/gpu-graphs.sh" >"$W/logs/graphs.txt" 2>&1
	note "CUDA graphs (capture, torch.cuda.graph, torch.compile): exit $? ($((SECONDS - t0)) s)"
	sed 's/^/  /' "$W/logs/graphs/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

if part reliab && [ -f "$ROOT/scripts/gpu-reliability.sh" ]; then
	t0=$SECONDS
	OUT=$W/logs/reliab SOAK_DURATION=${SOAK_DURATION:-40} bash "$ROOT/scripts/gpu-reliability.sh" >"$W/logs/reliab.txt" 2>&1
	note "reliability (out of memory, soak): exit $? ($((SECONDS - t0)) s)"
	sed 's/^/  /' "$W/logs/reliab/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
fi

if part costs; then
	# The driver alone: what a handle operation costs however it is called,
	# and how the queries the shim makes per call scale over threads.
	if nvcc -O2 -o "$W/vmm_costs" "$ROOT/bench/vmm_costs.cu" -lcuda >"$W/logs/costs-build.txt" 2>&1 &&
		nvcc -O2 -o "$W/driver_queries" "$ROOT/bench/driver_queries.cu" -lcuda >>"$W/logs/costs-build.txt" 2>&1; then
		"$W/vmm_costs" >"$W/logs/vmm_costs.txt" 2>&1
		note "driver costs, us per handle (second pass; bench/vmm_costs.cu): exit $?"
		grep '^offset map' "$W/logs/vmm_costs.txt" | sed 's/^/  /' | tee -a "$SUMMARY"
		sed -n '/^pass 1/,$p' "$W/logs/vmm_costs.txt" | grep '^cost' | sed 's/^cost /  /' | tee -a "$SUMMARY"
		"$W/driver_queries" >"$W/logs/driver_queries.txt" 2>&1
		note "driver queries, 8 threads over 1, then the fences' calls on one (bench/driver_queries.cu): exit $?"
		sed 's/^/  /' "$W/logs/driver_queries.txt" | tee -a "$SUMMARY"
	else
		note "driver costs: build failed (logs/costs-build.txt)"
	fi
fi

if part fences; then
	# Synchronous frees over N non-blocking streams (bench/fence_streams.py):
	# PyTorch without its cache under the preload, every free synchronous;
	# FENCE_ROUNDS rounds, each config a process, alternated. A config is
	# SIDE:EXTRA:DIM, SIDE 1 for a torch.cuda.Stream() (128 streams), EXTRA
	# idle streams more, DIM the layers' width (1024: the host sets the
	# step's pace; 4096: the GPU does). Each runs with the library's
	# defaults, with VPMM_SYNC_FREE=device (every free synchronises), and
	# with FENCE_BASE's library where that names another revision's tree
	# (as gpu-pressure.sh's BASE: git archive REV allocator shim tools
	# meson.build include | tar -x -C DIR). A run that fails leaves a line
	# saying so.
	t0=$SECONDS
	lib=$W/libvpmm.so
	# shellcheck source=scripts/gpu-build.sh
	. "$ROOT/scripts/gpu-build.sh"
	hows="default device"
	ok=1
	vpmm_build_lib "$lib" >"$W/logs/fences-build.txt" 2>&1 || ok=0
	if [ "$ok" = 1 ] && [ -n "${FENCE_BASE:-}" ]; then
		if vpmm_build_lib "$W/libvpmm-base.so" "$(cd "$FENCE_BASE" 2>/dev/null && pwd)" \
			>>"$W/logs/fences-build.txt" 2>&1; then
			hows="default base device"
		else
			ok=0
		fi
	fi
	if [ "$ok" = 1 ]; then
		: >"$W/logs/fences.txt"
		for round in $(seq "${FENCE_ROUNDS:-2}"); do
			for cfg in ${FENCE_CONFIGS:-1:0:1024 1:0:4096 1:32:2048 1:128:4096 0:0:1024}; do
				IFS=: read -r side extra dim <<<"$cfg"
				for how in $hows; do
					so=$lib
					envs=(VPMM_SOCKET=off PYTORCH_NO_CUDA_MEMORY_CACHING=1)
					args=(--extra "$extra" --dim "$dim" --steps "${FENCE_STEPS:-60}")
					[ "$how" = base ] && so=$W/libvpmm-base.so
					[ "$how" = device ] && envs+=(VPMM_SYNC_FREE=device)
					[ "$side" = 1 ] && args+=(--side)
					line=$(env "${envs[@]}" LD_PRELOAD="$so" python3 \
						"$ROOT/bench/fence_streams.py" "${args[@]}" 2>>"$W/logs/fences-err.txt")
					rc=$?
					[ "$rc" = 0 ] && [ -n "$line" ] ||
						line="fence_streams cfg=$cfg FAILED, exit $rc (logs/fences-err.txt)"
					echo "round=$round how=$how $line" >>"$W/logs/fences.txt"
				done
			done
		done
		note "synchronous frees over N non-blocking streams (bench/fence_streams.py; $((SECONDS - t0)) s):"
		sed 's/^/  /' "$W/logs/fences.txt" | tee -a "$SUMMARY"
	else
		note "fences: build failed, or FENCE_BASE=${FENCE_BASE:-} is not a source tree (logs/fences-build.txt)"
	fi
fi

if part step; then
	t0=$SECONDS
	OUT=$W/logs/step ROUNDS=${STEP_ROUNDS:-1} MODES=${STEP_MODES:-pluggable pluggable:VPMM_GROWTH_SPLIT=1 shim} \
		bash "$ROOT/scripts/gpu-torch-step.sh" >"$W/logs/step.txt" 2>&1
	note "PyTorch step, native, pluggable and the preload without caching alternated: exit $? ($((SECONDS - t0)) s)"
	grep -E '^(round|median|preload)|per step|calls by duration' "$W/logs/step.txt" | sed 's/^/  /' | tee -a "$SUMMARY"
fi

if part capacity; then
	# The largest Llama-shaped training step each allocator completes while
	# a second process holds the device to CAPACITY_BUDGET (bench/capacity.py).
	t0=$SECONDS
	# shellcheck source=scripts/gpu-build.sh
	. "$ROOT/scripts/gpu-build.sh"
	# CAPACITY_TIMED=1: a clock around the pluggable allocator's and the
	# preload's calls (test/gpu/torch_timed.c), their time a step reported
	timed=()
	if vpmm_build_lib "$W/libvpmm-cap.so" >"$W/logs/capacity-build.txt" 2>&1 &&
		nvcc -O2 -o "$W/hold" "$ROOT/test/gpu/hold.cu" >>"$W/logs/capacity-build.txt" 2>&1 &&
		{ [ -z "${CAPACITY_TIMED:-}" ] ||
			{ gcc -O2 -std=gnu11 -fPIC -shared -o "$W/libcap_timed.so" "$ROOT/test/gpu/torch_timed.c" \
				-ldl -lpthread && gcc -O2 -std=gnu11 -fPIC -shared -DTIMED_RUNTIME \
				-o "$W/libcap_shim_timed.so" "$ROOT/test/gpu/torch_timed.c" -ldl -lpthread &&
				timed=(--timed-lib "$W/libcap_timed.so" --timed-shim "$W/libcap_shim_timed.so"); } \
				>>"$W/logs/capacity-build.txt" 2>&1; }; then
		python3 "$ROOT/bench/capacity.py" --hold "$W/hold" --lib "$W/libvpmm-cap.so" \
			--budget "${CAPACITY_BUDGET:-12G}" --tries "${CAPACITY_TRIES:-10}" --start "${CAPACITY_START:-16}" \
			--ceiling "${CAPACITY_CEILING:-0}" \
			--rounds "${CAPACITY_ROUNDS:-3}" ${timed[@]+"${timed[@]}"} \
			--modes "${CAPACITY_MODES:-native,expandable,pluggable,preload}" --out "$OUT/capacity.json" >"$W/logs/capacity.txt" 2>"$W/logs/capacity-err.txt"
		note "capacity under a second process holding all but ${CAPACITY_BUDGET:-12G}: exit $? ($((SECONDS - t0)) s)"
		sed -n '/^capacity /p;/(round /p;/by a call/p;/^| /,$p' "$W/logs/capacity.txt" | sed 's/^/  /' | tee -a "$SUMMARY"
	else
		note "capacity: build failed (logs/capacity-build.txt)"
	fi
fi

if part bench; then
	t0=$SECONDS
	OUT=$W/logs/bench DEADLINE=${DEADLINE:-170} bash "$ROOT/scripts/gpu-bench.sh" >"$W/logs/bench.txt" 2>&1
	note "benchmarks: exit $? ($((SECONDS - t0)) s); the table: table.md"
	cp "$W/logs/bench/table.md" "$OUT/table.md" 2>/dev/null
fi

pmodes=""
part pressure && pmodes=pressure
part soak && pmodes="${pmodes:+$pmodes }soak"
if [ -n "$pmodes" ]; then
	t0=$SECONDS
	OUT=$W/logs/pressure MODES=$pmodes SOAK=0 bash "$ROOT/scripts/gpu-pressure.sh" >"$W/logs/pressure.txt" 2>&1
	note "memory pressure from another process ($pmodes): exit $? ($((SECONDS - t0)) s); the tables: ${pmodes// /.md, }.md"
	for m in $pmodes; do
		cp "$W/logs/pressure/$m.md" "$OUT/$m.md" 2>/dev/null
		grep -E '^(Runs|Stopped|Fewer)' "$W/logs/pressure/$m.md" 2>/dev/null | sed "s/^/  $m: /" | tee -a "$SUMMARY"
	done
fi

for p in address multi; do
	part "$p" || continue
	t0=$SECONDS
	OUT=$W/logs/$p PART=$p bash "$ROOT/scripts/gpu-address.sh" >"$W/logs/$p.txt" 2>&1
	note "what pool memory answers ($p, scripts/gpu-address.sh): exit $? ($((SECONDS - t0)) s)"
	sed 's/^/  /' "$W/logs/$p/summary.txt" 2>/dev/null | tee -a "$SUMMARY"
done

tar -C "$W" -czf "$OUT/logs.tgz" logs
echo
echo "================ summary ================"
cat "$SUMMARY"
[ -f "$OUT/table.md" ] && grep -E "peak used|replay time|growth|threads|pool hit" "$OUT/table.md" | cut -c1-200 | head -30
for m in $pmodes; do
	[ -f "$OUT/$m.md" ] && { echo; cat "$OUT/$m.md"; }
done
rm -rf "$W"
