#!/usr/bin/env bash
# gpu-python.sh — the Python package vpmm with real PyTorch on a GPU: the
# checks test/python makes against stand-ins, made against CUDA and torch
# (test/gpu/vpmm_package.py). The device machine has no meson nor
# meson-python, so the package is laid out by hand as `pip install .` lays
# it: python/vpmm/*.py, _version.py from meson.build's version,
# libvpmm.so from scripts/gpu-build.sh, and the extension module _history
# built with gcc against python3's headers (without them, the history
# check fails and says why; the others run). Needs gcc, python3 with torch.
# Exit status 0 when every check passed. Output: $OUT.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-gpu-python}
W=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# shellcheck source=scripts/gpu-build.sh
. "$ROOT/scripts/gpu-build.sh"
pkg=$W/site/vpmm
mkdir -p "$pkg/_startup"
vpmm_build_lib "$pkg/libvpmm.so" 2>"$OUT/build.log" || { cat "$OUT/build.log"; exit 1; }
cp "$ROOT"/python/vpmm/*.py "$pkg/"
cp "$ROOT/python/vpmm/_startup/sitecustomize.py" "$pkg/_startup/"
sed "s/@VPMM_VERSION@/$(vpmm_version_of "$ROOT")/" "$ROOT/python/vpmm/_version.py.in" >"$pkg/_version.py"
pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
pyext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [[ -f $pyinc/Python.h ]]; then
	gcc -O2 -std=gnu11 -fPIC -shared -fvisibility=hidden -I"$pyinc" \
		"$ROOT/python/vpmm/_history.c" -o "$pkg/_history$pyext" -lpthread 2>>"$OUT/build.log" ||
		{ cat "$OUT/build.log"; exit 1; }
else
	echo "no $pyinc/Python.h (python3-dev): vpmm._history not built"
fi

PYTHONPATH=$W/site python3 "$ROOT/test/gpu/vpmm_package.py" 2>&1 | tee "$OUT/vpmm_package.txt"
status=${PIPESTATUS[0]}
rm -rf "$W"
exit "$status"
