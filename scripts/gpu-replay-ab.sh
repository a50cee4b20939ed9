#!/usr/bin/env bash
# gpu-replay-ab.sh — the pool of another revision against this tree's, on
# the benchmark's replays (cudaMalloc through the shim), alternated round by
# round beside the CUDA pool, so that both see the same machine. Prints one
# line per replay, then per workload the medians of the time in allocator
# calls, how many rounds the tree was faster, and in how many replays each
# pool's peak was at or below the CUDA pool's.
#
# The other revision's sources must be in the working tree, since the
# device machine gets no git history: before the device call,
#   git archive REV allocator shim include tools meson.build | tar -x -C OLD_DIR
# with OLD_DIR untracked (not ignored), e.g. exp-old/.
#
# Environment: OLD (exp-old), ROUNDS (6), WLS (the four large workloads),
# SEEDS (the workloads' seeds, 5), CUDA_HOME, OUT (a folder to keep every
# replay's raw result in, as replay-ab.txt; unset, none is kept). Needs gcc
# and python3; the replays need CUDA and NVML.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=$(cd "${OLD:-$ROOT/exp-old}" && pwd) || exit 1
CUDA=${CUDA_HOME:-/usr/local/cuda}
ROUNDS=${ROUNDS:-6}
WLS=${WLS:-llm_serving training_varlen moe scratch_streams}
SEEDS=${SEEDS:-5}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
# Each tree's shim, from that tree's own meson.build source lists.
vpmm_build_lib "$W/old/libvpmm.so" "$OLD" || { echo "building $OLD failed"; exit 1; }
vpmm_build_lib "$W/new/libvpmm.so" "$ROOT" || { echo "building this tree failed"; exit 1; }
for seed in $SEEDS; do
	python3 "$ROOT/bench/workloads.py" --seed "$seed" --out "$W/wl$seed" >/dev/null || exit 1
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
replay() { # ALLOC TRACE [LD_PRELOAD]: the RESULT json of one replay
	env VPMM_SOCKET=off ${3:+LD_PRELOAD=$3} python3 "$ROOT/bench/replay_gpu.py" run \
		--alloc "$1" --trace "$2" 2>&1 | sed -n 's/^RESULT //p'
}
for r in $(seq "$ROUNDS"); do
	for seed in $SEEDS; do
		for wl in $WLS; do
			t=$W/wl$seed/$wl.csv
			echo "$r.$seed $wl cuda $(replay cuda_pool "$t")"
			for v in old new; do
				echo "$r.$seed $wl $v $(replay vpmm_preload "$t" "$W/$v/libvpmm.so")"
			done
		done
	done
done >"$W/results.txt"
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && cp "$W/results.txt" "$OUT/replay-ab.txt"
python3 - "$W/results.txt" <<'PY'
import collections, json, statistics, sys
calls = collections.defaultdict(list)
parts = collections.defaultdict(list)   # (median alloc ns, median free ns, slow s)
peaks = {}
for line in open(sys.argv[1]):
    r, wl, v, js = line.split(" ", 3)
    d = json.loads(js) if js.strip() else {}
    if not d.get("ok"):
        print("%s %s %s: %s" % (r, wl, v, d.get("error", "no result")))
        continue
    s = d.get("pool_stats", {})
    print("%s %-16s %-4s call %.4f s  peak/live %.4f  created %s remapped %s deferred %s"
          "  median alloc %s ns free %s ns  slow %d calls %.4f s" % (
        r, wl, v, d["call_s"], d["ratio"] or 0, s.get("handles_created", "-"),
        s.get("handles_remapped", "-"), s.get("reclaims_deferred", "-"),
        d.get("alloc_ns"), d.get("free_ns"), d.get("slow_calls", 0), d.get("slow_s", 0)))
    calls[wl, v].append(d["call_s"])
    parts[wl, v].append((d.get("alloc_ns") or 0, d.get("free_ns") or 0, d.get("slow_s", 0)))
    peaks[r, wl, v] = d["ratio"] or 0
for wl in dict.fromkeys(k[0] for k in calls):
    c, o, n = (calls[wl, v] for v in ("cuda", "old", "new"))
    if not (c and o and n):
        continue
    faster = sum(b < a for a, b in zip(o, n))
    print("%-16s CUDA pool %.4f s, old %.4f s, new %.4f s: new/old %.3f, faster in %d of %d" % (
        wl, statistics.median(c), statistics.median(o), statistics.median(n),
        statistics.median(n) / statistics.median(o), faster, min(len(o), len(n))))
    print("%-16s medians of a call (alloc / free ns) and of the slow calls' time: %s" % (
        wl, ", ".join("%s %.0f / %.0f, %.4f s" % (v, *(statistics.median(x[i] for x in parts[wl, v])
                                                        for i in range(3)))
                      for v in ("cuda", "old", "new"))))
    runs = [r for (r, w, v) in peaks if w == wl and v == "cuda"]
    for v in ("old", "new"):
        both = [r for r in runs if (r, wl, v) in peaks]
        at = sum(peaks[r, wl, v] <= peaks[r, wl, "cuda"] for r in both)
        excess = statistics.mean(peaks[r, wl, v] - peaks[r, wl, "cuda"] for r in both) if both else 0
        print("%-16s %s: peak at or below the CUDA pool's in %d of %d replays, %+.4f on average" % (
            wl, v, at, len(both), excess))
PY
