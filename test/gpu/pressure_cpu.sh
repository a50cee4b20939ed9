#!/usr/bin/env bash
# pressure_cpu.sh — what of scripts/gpu-pressure.sh can be checked without a
# GPU, in about a minute: the hold program's logic over a simulated device
# (test/gpu/hold_runtime), replay_gpu.py's failure report, the script's dry run,
# a whole run of both modes with FAKE_GPU=1 (simulated holder, dry replays,
# injected crashes), a hang and the deadline, and an interrupted run.
# Needs g++, python3; no GPU.
# Prints one "ok" or "FAIL" line a check; exit status 0 when all passed.
# Not in the meson suites (a minute of two shared cores); run it by hand
# after changing bench/pressure*.py, bench/replay_gpu.py, test/gpu/hold.cu or
# scripts/gpu-pressure.sh.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
FAILS=0
check() { # check NAME CONDITION-STATUS [detail]
	if [ "$2" = 0 ]; then echo "ok   $1"; else
		echo "FAIL $1${3:+: $3}"
		FAILS=$((FAILS + 1))
	fi
}

# ---- the hold program over a simulated device -------------------------------------
g++ -O1 -Wall -Wextra -Werror -x c++ -I"$ROOT/test/gpu/hold_runtime" "$ROOT/test/gpu/hold.cu" \
	-x none "$ROOT/test/gpu/hold_runtime/fake_runtime.cpp" -o "$W/hold" 2>"$W/build.txt"
check "hold.cu builds over the stand-in runtime" $? "$(head -5 "$W/build.txt")"
export FAKE_OTHER=$W/other
echo 0 >"$FAKE_OTHER"
{
	for leave in 4294967296 5000000000 1073741824 0 14495514624 107374182400; do
		echo "leave $leave"
	done
	echo bogus
	echo quit
} | "$W/hold" --leave 4G >"$W/hold.txt" 2>&1
check "hold exits 0 on quit" $?
# Every HOLD line leaves at least what was asked and less than 2 MiB more
# (or holds nothing and says short when the device has less).
python3 - "$W/hold.txt" <<'EOF'
import sys
asked = [4 << 30, 4294967296, 5000000000, 1073741824, 0, 14495514624, 107374182400]
lines = open(sys.argv[1]).read().splitlines()
holds = [dict(kv.split("=") for kv in l.split()[1:]) for l in lines if l.startswith("HOLD ")]
assert len(holds) == len(asked), lines
for a, h in zip(asked, holds):
    free, held, short = int(h["free"]), int(h["held"]), int(h["short"])
    if a >= int(h["total"]):
        assert held == 0 and short == 1, (a, h)
    else:
        assert a <= free < a + (2 << 20), (a, h)
        assert short == 0, (a, h)
assert lines[-1].startswith("HOLD-ERROR unknown command"), lines[-1]
EOF
check "hold leaves what it is asked, within 2 MiB above" $? "$(cat "$W/hold.txt")"
# Another process's memory that comes back late: the hold waits for it.
(
	echo "leave 10737418240"
	sleep 0.3
	echo $((1 << 30)) >"$FAKE_OTHER"
	(sleep 0.4 && echo 0 >"$FAKE_OTHER") &
	echo "leave 10737418240"
	sleep 1.2
	echo $((1 << 30)) >"$FAKE_OTHER"
	echo "leave 10737418240"
	sleep 1.5
	echo quit
) | "$W/hold" --leave 4G --settle-ms 800 >"$W/settle.txt" 2>&1
grep -o 'settled=[01]' "$W/settle.txt" | tr '\n' ' ' | grep -q '^settled=1 settled=1 settled=1 settled=0 $'
check "hold waits for memory on its way back, up to --settle-ms" $? "$(cat "$W/settle.txt")"
echo 0 >"$FAKE_OTHER"
"$W/hold" --leave 1G --parent 1 </dev/null >"$W/parent.txt" 2>&1
[ $? = 1 ] && grep -q 'HOLD-ERROR the parent 1 is gone' "$W/parent.txt"
check "hold exits when its parent is not the one named" $?
"$W/hold" --leave 4Q </dev/null >/dev/null 2>&1
[ $? = 2 ]
check "hold refuses a size it cannot read" $?
unset FAKE_OTHER

# ---- replay_gpu.py -----------------------------------------------------------------
python3 "$ROOT/bench/replay_gpu.py" --help >/dev/null && python3 "$ROOT/bench/pressure.py" --help >/dev/null
check "replay_gpu.py and pressure.py --help" $?
python3 "$ROOT/bench/workloads.py" --out "$W/wl" --seed 11 --lab-scale 4 >/dev/null
VPMM_BENCH_DRY_CAPACITY=$((3 << 30)) python3 "$ROOT/bench/replay_gpu.py" run --alloc dry \
	--trace "$W/wl/llm_serving.csv" >"$W/oom.txt"
rc=$?
python3 - "$W/oom.txt" "$rc" <<'EOF'
import json, sys
res = json.loads(open(sys.argv[1]).read().split("RESULT ", 1)[1])
assert sys.argv[2] == "1", sys.argv[2]
assert res["ok"] is False and res["failure"] == "oom", res
assert res["failed_at"] == res["done_ops"] and res["failed_at"] > 0, res
assert res["failed_size"] > 0 and res["setup_used"] == 0, res
EOF
check "replay_gpu.py reports an allocation that failed: failure, failed_at, exit 1" $?

# ---- the script: dry run -----------------------------------------------------------
DRY_RUN=1 OUT=$W/dry ONLY=moe,lab_free_0_2_then_32 MODES="pressure soak" SOAK_MARGINS=1.00,1.10 \
	bash "$ROOT/scripts/gpu-pressure.sh" >"$W/dry.txt" 2>&1
rc=$?
runs=$(grep -c '^run: ' "$W/dry.txt")
# pressure: 2 workloads x 5 allocators x 2; soak: 2 x 4 set-ups, then
# 2 margins x 2 workloads x 4 settings x 2 allocators.
[ $rc = 0 ] && [ "$runs" = $((20 + 8 + 32)) ] && grep -q '^would run: .*nvcc' "$W/dry.txt"
check "DRY_RUN=1 prints every replay and runs none (60 expected, $runs printed)" $? "exit $rc"
[ ! -e "$W/dry/pressure.md" ]
check "DRY_RUN=1 writes no table" $?

# BASE: another revision's library joins after vpmm_preload, preloaded in
# its runs and only in its runs.
DRY_RUN=1 BASE=$ROOT OUT=$W/dry-base ONLY=moe PRESSURE_ALLOCS=cuda_pool,vpmm_preload,torch_native \
	bash "$ROOT/scripts/gpu-pressure.sh" >"$W/dry-base.txt" 2>&1
rc=$?
grep '^run: ' "$W/dry-base.txt" | sed -n 's/.*--alloc \([a-z_]*\) .*/\1/p' | tr '\n' ' ' >"$W/order.txt"
[ $rc = 0 ] && [ "$(cat "$W/order.txt")" = "cuda_pool cuda_pool vpmm_preload vpmm_preload vpmm_preload vpmm_preload torch_native torch_native " ] &&
	[ "$(grep -c '^run: .*LD_PRELOAD=[^ ]*/base/libvpmm.so' "$W/dry-base.txt")" = 2 ] &&
	[ "$(grep -c '^run: .*LD_PRELOAD=' "$W/dry-base.txt")" = 4 ]
check "BASE=DIR: base:vpmm_preload runs after vpmm_preload with the other library" $? \
	"exit $rc, order $(cat "$W/order.txt")"
python3 "$ROOT/bench/pressure.py" pressure --workloads "$W/wl" --allocs base:vpmm_torch,base:cuda_pool \
	--dry-run >"$W/base-bad.txt" 2>&1
[ $? = 1 ] && grep -q 'unknown allocator(s): base:cuda_pool' "$W/base-bad.txt"
check "pressure.py refuses base: before an allocator that is not libvpmm's" $? "$(tail -2 "$W/base-bad.txt")"

# ---- the script: a whole fake run ------------------------------------------------------
FAKE_GPU=1 OUT=$W/fake ONLY=moe,lab_free_0_2_then_32,lab_10g_pattern MODES="pressure soak" \
	SOAK_DEADLINE=12 FAKE_FAULTS=torch_native:abort:20,vpmm_torch:exit:40 \
	bash "$ROOT/scripts/gpu-pressure.sh" >"$W/fake.txt" 2>&1
check "FAKE_GPU=1, both modes: exit 0" $? "$(tail -5 "$W/fake.txt")"
python3 - "$W/fake" <<'EOF'
import json, os, sys
d = sys.argv[1]
p = json.load(open(os.path.join(d, "pressure.json")))
out = {(r["workload"], r["alloc"], r["phase"]): r for r in p["runs"]}
# moe needs 1.03 x live in 2 MiB pieces: out of memory at 1.02; lab_10g fits.
assert out[("moe", "cuda_pool", "pressure")]["outcome"] == "oom", out[("moe", "cuda_pool", "pressure")]
assert out[("lab_10g_pattern", "cuda_pool", "pressure")]["outcome"] == "completed"
# torch_native aborts at its 20th allocation (moe), not in the laboratory cases.
assert out[("moe", "torch_native", "alone")]["outcome"] == "crash"
assert out[("moe", "torch_native", "alone")]["signal"] == "SIGABRT"
assert out[("lab_10g_pattern", "torch_native", "alone")]["outcome"] == "completed"
r = out[("moe", "vpmm_torch", "alone")]
assert r["outcome"] == "crash" and "exit status 3" in r["why"], r
# Every pressure run left what it said: margin x live + set-up + allowance.
for r in p["runs"]:
    if r["phase"] == "pressure" and r.get("outcome") not in (None, "not run"):
        assert r["holder"]["free"] >= r["leave"], r
        assert r["leave"] >= 1.02 * r["peak_live"] + 16 * 2**20, r
md = open(os.path.join(d, "pressure.md")).read()
assert "FAKE" in md and "**CRASH** SIGABRT" in md and "oom at" in md, md
s = json.load(open(os.path.join(d, "soak.json")))
# How many runs the 12 s deadline leaves depends on the machine's load.
assert len(s["calibration"]) == 8 and s["runs"], (len(s["calibration"]), len(s["runs"]))
assert len(s["runs"]) + s.get("not_run", 0) == s["planned"]
for r in s["runs"]:    # the only crashes are the injected ones
    bad = r["outcome"] == "crash" and not (r["alloc"] == "vpmm_torch" and "status 3" in r["why"])
    assert r["outcome"] in ("completed", "oom", "crash") and not bad, (r["outcome"], r["why"])
assert os.path.exists(os.path.join(d, "soak.md"))
EOF
check "FAKE_GPU=1: outcomes classified, leaves right, tables written" $?

# ---- a hang, and the deadline ---------------------------------------------------------
# The pluggable allocator's set-up replays hang: killed at the 2 s limit,
# which also takes the command past its 1 s deadline before the first run.
python3 "$ROOT/bench/pressure.py" soak --workloads "$W/wl" --fake --out "$W/hang.json" \
	--only lab_free_0_2_then_32 --fake-fault vpmm_torch:hang:0 --timeout 2 --deadline 1 \
	>"$W/hang.txt" 2>&1
rc=$?
python3 - "$W/hang.json" "$rc" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert sys.argv[2] == "0", sys.argv[2]
cal = {(r["alloc"], r["vpmm_env"]): r["outcome"] for r in s["calibration"]}
assert set(cal.values()) == {"hang", "completed"}, cal
assert all(o == "hang" for (a, _), o in cal.items() if a == "vpmm_torch"), cal
assert s["runs"] == [] and s["not_run"] == s["planned"] == 40, (len(s["runs"]), s.get("not_run"))
EOF
check "a replay past --timeout is a hang; no run starts past --deadline" $? "$(tail -3 "$W/hang.txt")"

# ---- the script interrupted: nothing left behind --------------------------------------------
FAKE_GPU=1 OUT=$W/int MODES=soak SOAK_DEADLINE=60 bash "$ROOT/scripts/gpu-pressure.sh" >"$W/int.txt" 2>&1 &
script=$!
holder=""
for _ in $(seq 1 100); do
	driver=$(pgrep -P "$script" -f 'pressure.py soak' | head -1)
	[ -n "$driver" ] && holder=$(pgrep -P "$driver" -f 'pressure.py fake-hold' | head -1)
	[ -n "$holder" ] && break
	sleep 0.1
done
sleep 2
kill -TERM "$script"
wait "$script"
rc=$?
sleep 0.5
gone=0
[ -n "$holder" ] || gone=1
[ -n "$holder" ] && [ -d "/proc/$holder" ] && [ "$(awk '{print $3}' "/proc/$holder/stat")" != Z ] && gone=1
[ -n "$driver" ] && [ -d "/proc/$driver" ] && [ "$(awk '{print $3}' "/proc/$driver/stat")" != Z ] && gone=1
[ $gone = 0 ] && [ $rc = 143 ] && [ -s "$W/int/soak.md" ]
check "SIGTERM: exit 143, driver and holder gone, the table of what ran" $? \
	"exit $rc, driver ${driver:-?}, holder ${holder:-never seen}"

echo "pressure_cpu: $([ $FAILS = 0 ] && echo PASS || echo "FAIL ($FAILS)")"
exit $((FAILS > 0))
