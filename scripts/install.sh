#!/usr/bin/env bash
# install.sh — installs from Debian's packages what building and testing
# libvpmm need, checks the CUDA Toolkit headers, configures build/ and builds.
# Safe to run again: installed packages are skipped, an existing build/ is
# reconfigured.
#
# Environment (all optional):
#   CUDA_INCLUDE  directory holding cuda.h (default /usr/local/cuda/include)
#   BUILD_DIR     build directory (default build)
#   NINJA_JOBS    parallel jobs for ninja (default: ninja's choice)
#   SANITIZERS=0  skip the build-asan and build-tsan directories
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The meson option of meson_options.txt naming the CUDA include directory.
CUDA_OPTION=toolkit_include
CUDA_INCLUDE_DEFAULT=/usr/local/cuda/include
CUDA_INCLUDE=${CUDA_INCLUDE:-}
BUILD_DIR=${BUILD_DIR:-build}
# gcc + libc6-dev: the compiler and C headers (apt would skip libc6-dev as a
# mere recommendation). python3: the replay tests parse JSON with it.
# valgrind: the `meson test --setup valgrind` setup.
PACKAGES=(meson ninja-build pkg-config gcc libc6-dev libcriterion-dev python3 valgrind)

say() { printf '==> %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# ---- packages ----------------------------------------------------------------
command -v dpkg-query >/dev/null || die "dpkg-query not found: this script expects Debian (12) or a derivative; install by hand: ${PACKAGES[*]}"
missing=()
for p in "${PACKAGES[@]}"; do
	installed "$p" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	say "packages already installed: ${PACKAGES[*]}"
else
	SUDO=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || die "not root and no sudo: install as root: apt-get install ${missing[*]}"
		SUDO=(sudo)
	fi
	say "installing: ${missing[*]}"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
		die "apt-get update failed (network? sources.list?)"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}" ||
		die "apt-get install failed for: ${missing[*]}"
fi
pkg-config --exists criterion || die "pkg-config does not find criterion although libcriterion-dev is installed"

# ---- CUDA headers --------------------------------------------------------------
# Only the headers are needed: libcuda.so.1 is opened at run time, and the
# tests run on a host driver that needs no GPU.
cuda_dir=${CUDA_INCLUDE:-$CUDA_INCLUDE_DEFAULT}
if [[ ! -f $cuda_dir/cuda.h ]]; then
	die "$cuda_dir/cuda.h not found. The CUDA Toolkit headers are needed (not installed by this script).
  If they are elsewhere, run: CUDA_INCLUDE=/path/to/include $0
  (or configure by hand: meson setup -D$CUDA_OPTION=/path/to/include $BUILD_DIR)"
fi
say "CUDA headers: $cuda_dir/cuda.h"

# ---- configure and build ---------------------------------------------------------
# Three build directories: $BUILD_DIR (the tests), and the sanitizer builds
# that issue 6 asks CI to run: build-asan (AddressSanitizer + UBSan) and
# build-tsan (ThreadSanitizer), used with `meson test --setup asan|tsan`.
setup_args=()
[[ -n $CUDA_INCLUDE ]] && setup_args+=("-D$CUDA_OPTION=$CUDA_INCLUDE")

configure_and_build() { # DIR [meson options...]
	local dir=$1
	shift
	if [[ -f $dir/meson-private/coredata.dat ]]; then
		say "reconfiguring $dir"
		meson setup --reconfigure "${setup_args[@]}" "$@" "$dir"
	else
		say "configuring $dir"
		meson setup "${setup_args[@]}" "$@" "$dir"
	fi
	say "building $dir"
	ninja -C "$dir" ${NINJA_JOBS:+-j "$NINJA_JOBS"}
}

configure_and_build "$BUILD_DIR"
if [[ ${SANITIZERS:-1} != 0 ]]; then
	configure_and_build build-asan -Db_sanitize=address,undefined -Db_lundef=false
	configure_and_build build-tsan -Db_sanitize=thread -Db_lundef=false
fi
say "done; run the tests with the README's test command"
