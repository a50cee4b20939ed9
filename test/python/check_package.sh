#!/usr/bin/env bash
# check_package.sh — `pip install` of this repository into a fresh virtual
# environment, offline: the build backend (meson-python, with meson and
# ninja) comes from the system (Debian's python3-mesonpy, which
# scripts/install.sh installs), --no-build-isolation --no-index, so nothing
# is downloaded. Then check_package.py checks the installed package in
# that environment.
#
#   check_package.sh SOURCE_DIR VERSION CUDA_INCLUDE FAKE_CUDA_DIR
#
# $CHECK_NATIVE_THREADS: the library of native_threads.c (meson test sets
# it), threads Python never saw, for the allocation history's scenario.
#
# The Python used: $VPMM_TEST_PYTHON, else the first of /usr/bin/python3 and
# python3 that has meson-python, venv and ensurepip. Exit 77 (skipped) only
# when there is none; 1 on any failure.
set -euo pipefail
src=$1 version=$2 cuda_include=$3 fake_dir=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

py=
for cand in ${VPMM_TEST_PYTHON:-} /usr/bin/python3 python3; do
	command -v "$cand" >/dev/null || continue
	if "$cand" -c 'import mesonpy, venv, ensurepip' 2>/dev/null; then
		py=$(command -v "$cand")
		break
	fi
done
if [[ -z $py ]]; then
	echo "no Python with meson-python, venv and ensurepip (scripts/install.sh installs python3-mesonpy and python3-venv)"
	exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --system-site-packages: the venv sees the system's meson-python; vpmm
# itself is installed into the venv, and check_package.py checks it is
# imported from there.
"$py" -m venv --system-site-packages "$tmp/venv" || { echo "FAIL: python -m venv"; exit 1; }
echo "ok: venv with $("$tmp/venv/bin/python" --version) ($py)"
# From a directory of its own: the source tree's python/ is not on the path.
cd "$tmp"
if ! PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$tmp/venv/bin/python" -m pip install \
	--no-build-isolation --no-index --no-deps --no-cache-dir \
	--config-settings=setup-args=-Dtoolkit_include="$cuda_include" "$src" >"$tmp/pip.log" 2>&1; then
	cat "$tmp/pip.log"
	echo "FAIL: pip install $src"
	exit 1
fi
echo "ok: pip install $src"
"$tmp/venv/bin/python" "$here/check_package.py" "$version" "$fake_dir" "$here/fake_torch"
