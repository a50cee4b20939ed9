#!/usr/bin/env bash
# gpu-dump.sh — vpmm-dump against a PyTorch process under libvpmm.so on a
# real GPU: list, text map, --map, --json (checked against the
# pool's stats), --torch-snapshot (loaded by PyTorch's own memory_viz code),
# and the VPMM_TRACE of the run replayed by vpmm-replay. Builds with gcc, no
# meson. Exit status 0 when every check passed. Output: $OUT.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu-dump}
W=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
fail=0
check() { if "$@"; then echo "ok      $*"; else echo "FAILED  $*"; fail=1; fi; }

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
vpmm_build_lib "$W/libvpmm.so" || exit 1
vpmm_build_tool vpmm-dump "$W/vpmm-dump" || exit 1
vpmm_build_tool vpmm-replay "$W/vpmm-replay" || exit 1

mkfifo "$W/go"
VPMM_TRACE=$OUT/trace.csv PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$W/libvpmm.so \
	python3 "$ROOT/test/gpu/dump_torch_work.py" <"$W/go" >"$OUT/work.out" 2>&1 &
pid=$!
exec 3>"$W/go"
for _ in $(seq 1 120); do grep -q ready "$OUT/work.out" && break; sleep 0.5; done
check grep -q ready "$OUT/work.out"
"$W/vpmm-dump" | tee "$OUT/list.txt"
check grep -q "^ *$pid" "$OUT/list.txt"
check "$W/vpmm-dump" "$pid"
"$W/vpmm-dump" "$pid" --map --color never | head -20
"$W/vpmm-dump" "$pid" --json >"$OUT/dump.json"
check test -s "$OUT/dump.json"
"$W/vpmm-dump" "$pid" --torch-snapshot "$OUT/snap.pickle"
check test -s "$OUT/snap.pickle"
check "$W/vpmm-dump" --trim "$pid" 0
echo go >&3
exec 3>&-
wait $pid
check test $? -eq 0
# The map adds up to the stats: live, free, holes as the pool counts them.
check python3 - "$OUT/dump.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["pools"][0]
sums = {k: sum(r["size"] for r in p["regions"] if r["kind"] == k) for k in ("live", "free", "hole", "zombie")}
st = p["stats"]
print("stats live", st["live"], "map", sums)
sys.exit(0 if sums["live"] == st["live"] and sums["live"] > 0 else 1)
PY
check python3 "$ROOT/test/gpu/dump_viz_check.py" "$OUT/snap.pickle" "$W/viz.html"
check test -s "$OUT/trace.csv"
check "$W/vpmm-replay" "$OUT/trace.csv"
rm -rf "$W"
exit $fail
