#!/bin/sh
# callgrind.sh — instructions per malloc+free pair of the pool's hot path,
# counted by valgrind's callgrind on bench/hotpath_cpu (host driver, no GPU).
#
# Runs hotpath_cpu with N pairs and with 0 pairs in each mode and divides the
# difference of the total instruction counts (Ir) by N, which removes the
# setup. Instruction counts do not depend on the machine's speed or load, so
# a regression shows as a number, not as noise.
#
# Usage: callgrind.sh [--pairs N] [--check MAX] [--skip REASON] HOTPATH_CPU
#   --check MAX    fail (exit 1) when a mode needs more than MAX instructions a
#                  pair; without valgrind, exit 77 (meson's "skipped").
#   --skip REASON  only check that the benchmark runs, then exit 77 saying why.
set -eu

pairs=20000
max=
skip=
while [ $# -gt 1 ]; do
	case "$1" in
	--pairs) pairs=$2; shift 2 ;;
	--check) max=$2; shift 2 ;;
	--skip) skip=$2; shift 2 ;;
	*) break ;;
	esac
done
if [ $# -ne 1 ]; then
	echo "usage: $0 [--pairs N] [--check MAX] HOTPATH_CPU" >&2
	exit 2
fi
exe=$1

if [ -z "$skip" ] && ! command -v valgrind >/dev/null 2>&1; then
	skip="valgrind is not installed"
fi
if [ -n "$skip" ]; then
	echo "SKIP: $skip; instruction counts not measured"
	# The benchmark must at least run.
	"$exe" --pairs 1000 --mode stream
	"$exe" --pairs 1000 --mode nostream
	exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Total Ir of one run (the "summary:" line of the callgrind output; older
# versions write "totals:").
ir() {
	out="$tmp/cg.$1.$2"
	valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$exe" --pairs "$2" --mode "$1" >"$tmp/stdout" 2>"$tmp/stderr" || {
		echo "hotpath_cpu --mode $1 --pairs $2 failed under valgrind:" >&2
		cat "$tmp/stdout" "$tmp/stderr" >&2
		exit 1
	}
	sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$out" | head -n 1
}

status=0
for mode in stream nostream; do
	full=$(ir "$mode" "$pairs")
	base=$(ir "$mode" 0)
	if [ -z "$full" ] || [ -z "$base" ]; then
		echo "could not read callgrind's totals" >&2
		exit 1
	fi
	per=$(( (full - base) / pairs ))
	echo "$mode: $per instructions per malloc+free pair ($pairs pairs; Ir $full - $base)"
	if [ -n "$max" ] && [ "$per" -gt "$max" ]; then
		echo "FAIL: $mode needs $per instructions a pair, over the bound of $max" >&2
		status=1
	fi
done
exit $status
