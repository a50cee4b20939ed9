#!/usr/bin/env bash
# gpu-torch-step.sh — issue 5's PyTorch target, measured so that run-to-run
# noise cannot decide it: the training step of test/gpu/shim_torch.py with
# PyTorch's native caching allocator and with CUDAPluggableAllocator over
# libvpmm.so, alternated ROUNDS times in one call (native, pluggable, native,
# ...), each a fresh process of STEPS steps. Single runs of the same mode
# differ by about 10 % between processes; alternating spreads clock and
# thermal drift over both. Prints every run's median step and peak, then the
# ratio of the medians of the rounds and its range over the rounds.
#
# Environment: ROUNDS (4), STEPS (200), OUT (build-gpu-torch-step),
# CUDA_HOME. Needs gcc and python3 with torch.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu-torch-step}
CUDA=${CUDA_HOME:-/usr/local/cuda}
ROUNDS=${ROUNDS:-4}
STEPS=${STEPS:-200}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
src() { grep -o "'[A-Za-z0-9_]*\.c'" "$ROOT/$1/meson.build" | tr -d "'" | sed "s|^|$ROOT/$1/|"; }
gcc -O2 -std=gnu11 -fPIC -shared -fvisibility=hidden -D_GNU_SOURCE \
	-I"$ROOT/allocator" -I"$ROOT/shim" -I"$CUDA/include" $(src allocator) $(src shim) \
	-Wl,--version-script="$ROOT/shim/libvpmm.map" -Wl,-Bsymbolic \
	-lpthread -ldl -o "$W/libvpmm.so" || exit 1
echo "gpu-torch-step $(date -u +%FT%H:%MZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $ROUNDS rounds of $STEPS steps"
for r in $(seq 1 "$ROUNDS"); do
	python3 "$ROOT/test/gpu/shim_torch.py" native "$STEPS" >"$OUT/native-$r.json" || exit 1
	VPMM_LIB="$W/libvpmm.so" python3 "$ROOT/test/gpu/shim_torch.py" pluggable "$STEPS" \
		>"$OUT/pluggable-$r.json" || exit 1
done
python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(mode, r):
    with open("%s/%s-%d.json" % (out, mode, r)) as f:
        return json.loads(f.read().strip().splitlines()[-1])
rows = []
for r in range(1, rounds + 1):
    n, p = load("native", r), load("pluggable", r)
    mib = lambda b: "%.0f" % (b / 2**20) if b else "?"
    rows.append((n["step_ms"], p["step_ms"], mib(n.get("max_reserved")),
                 mib(p.get("pool_mapped_peak")),
                 mib(n.get("nvml_peak")), mib(p.get("nvml_peak"))))
    print("round %d: native %.2f ms, pluggable %.2f ms (%.3f); allocator peak %s / %s MiB, NVML %s / %s MiB"
          % (r, rows[-1][0], rows[-1][1], rows[-1][1] / rows[-1][0], rows[-1][2], rows[-1][3],
             rows[-1][4], rows[-1][5]))
nat = statistics.median(x[0] for x in rows)
plu = statistics.median(x[1] for x in rows)
per = [x[1] / x[0] for x in rows]
print("median step: native %.2f ms, pluggable %.2f ms: ratio %.3f (rounds %.3f-%.3f); target <= 1.02"
      % (nat, plu, plu / nat, min(per), max(per)))
EOF
