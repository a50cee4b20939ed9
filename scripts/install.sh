#!/usr/bin/env bash
# install.sh — installs what building and testing libvpmm need (the
# distribution's packages, and on Ubuntu 22.04 meson and meson-python from
# PyPI), checks the CUDA Toolkit headers, configures build/ and builds.
# Safe to run again: installed packages are skipped, an existing build/ is
# reconfigured.
#
# Systems: Debian 12 or later, Ubuntu 22.04 or later (read from
# /etc/os-release). The package names are the same on all of them; what
# differs:
#   - Ubuntu 22.04 ships meson 0.61 and no meson-python, which the Python
#     package (pyproject.toml) needs with meson >= 0.63.3. There, meson and
#     meson-python come from PyPI, installed by pip for the system's
#     python3 (/usr/local, ahead of /usr/bin on PATH; 22.04's Python does
#     not forbid it): `meson` is then that one for the README's commands
#     too, and the python suite's virtual environment sees meson-python
#     through --system-site-packages. Debian 12 and Ubuntu 24.04 have both
#     as packages (meson, python3-mesonpy).
#   - Criterion (libcriterion-dev) is in Ubuntu's "universe" component.
#
#   scripts/install.sh          install, configure and build
#   scripts/install.sh --plan   print what would be installed here, and stop
#
# Environment (all optional):
#   CUDA_INCLUDE  directory holding cuda.h (default /usr/local/cuda/include)
#   BUILD_DIR     build directory (default build)
#   NINJA_JOBS    parallel jobs for ninja (default: ninja's choice)
#   SANITIZERS=0  skip the build-asan and build-tsan directories
#   OS_RELEASE    the os-release file read (default /etc/os-release)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The meson option of meson_options.txt naming the CUDA include directory.
CUDA_OPTION=toolkit_include
CUDA_INCLUDE_DEFAULT=/usr/local/cuda/include
CUDA_INCLUDE=${CUDA_INCLUDE:-}
BUILD_DIR=${BUILD_DIR:-build}
# gcc + libc6-dev: the compiler and C headers (apt would skip libc6-dev as a
# mere recommendation); g++: the C++ test program of the PyTorch entry
# point's exceptions (test/shim/torch_oom_prog.cpp). python3: the replay
# tests parse JSON with it, and man/md2man.py makes the man pages. valgrind: the `meson test --setup
# valgrind` setup. groff-base + man-db: the install suite renders the man
# pages (groff, tbl, man -l). python3-venv: the python suite's virtual
# environment (ensurepip). python3-dev: Python's headers, for the package's
# extension module (vpmm._history).
PACKAGES=(ninja-build pkg-config gcc g++ libc6-dev libcriterion-dev python3 valgrind
	groff-base man-db python3-venv python3-dev)
# Where the distribution has them (not Ubuntu 22.04: see above).
MESON_PACKAGES=(meson python3-mesonpy)
# From PyPI where it has not; python3-pip runs pip.
PIP_PACKAGES=('meson>=1.0' 'meson-python>=0.13')
PIP_APT_PACKAGES=(python3-pip)

say() { printf '==> %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

# ---- which system ----------------------------------------------------------------
# Sets OS_NAME ("debian 12"), and USE_PIP=1 where meson and meson-python
# come from PyPI. Anything but Debian >= 12 and Ubuntu >= 22.04 is refused
# with the list of what to install by hand.
detect_os() {
	local file=${OS_RELEASE:-/etc/os-release} id version major
	[[ -r $file ]] || die "$file not found: this script expects Debian 12 or Ubuntu 22.04 or later; install by hand: meson (>= 0.63.3) ${PACKAGES[*]} python3-mesonpy"
	# shellcheck disable=SC1090 # the file is the system's
	id=$(. "$file" && echo "${ID:-}")
	# shellcheck disable=SC1090
	version=$(. "$file" && echo "${VERSION_ID:-}")
	major=${version%%.*}
	[[ $major =~ ^[0-9]+$ ]] || major=0
	OS_NAME="$id $version"
	USE_PIP=0
	case $id in
	debian)
		if ((major < 12)); then
			die "Debian $version: Debian 12 or later is needed"
		fi
		;;
	ubuntu)
		if ((major < 22)); then
			die "Ubuntu $version: Ubuntu 22.04 or later is needed"
		fi
		if [[ $version == 22.* ]]; then
			USE_PIP=1
		fi
		;;
	*)
		die "$id $version is neither Debian nor Ubuntu; install by hand: meson (>= 0.63.3) ${PACKAGES[*]} python3-mesonpy, then run: meson setup build"
		;;
	esac
}

detect_os
if ((USE_PIP)); then
	PACKAGES+=("${PIP_APT_PACKAGES[@]}")
else
	PACKAGES+=("${MESON_PACKAGES[@]}")
fi
if [[ ${1:-} == --plan ]]; then
	echo "system: $OS_NAME"
	echo "apt: ${PACKAGES[*]}"
	((USE_PIP)) && echo "pip: ${PIP_PACKAGES[*]}"
	exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (only --plan)"

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# ---- packages ----------------------------------------------------------------
command -v dpkg-query >/dev/null || die "dpkg-query not found on $OS_NAME; install by hand: ${PACKAGES[*]}"
SUDO=()
[[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && SUDO=(sudo)
missing=()
for p in "${PACKAGES[@]}"; do
	installed "$p" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	say "packages already installed: ${PACKAGES[*]}"
else
	[[ $(id -u) -eq 0 || ${#SUDO[@]} -gt 0 ]] ||
		die "not root and no sudo: install as root: apt-get install ${missing[*]}"
	say "installing: ${missing[*]}"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
		die "apt-get update failed (network? sources.list?)"
	if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}"; then
		hint=
		[[ $OS_NAME == ubuntu* ]] && hint=" (libcriterion-dev is in Ubuntu's universe component: add-apt-repository universe)"
		die "apt-get install failed for: ${missing[*]}$hint"
	fi
fi
pkg-config --exists criterion || die "pkg-config does not find criterion although libcriterion-dev is installed"

# ---- meson and meson-python from PyPI (Ubuntu 22.04) ---------------------------------
pip_has() { # the system python3 imports module $1 at version >= $2
	python3 - "$1" "$2" <<'PY' 2>/dev/null
import importlib, sys
from importlib.metadata import version
name, want = sys.argv[1], sys.argv[2]
dist = {"mesonbuild": "meson", "mesonpy": "meson-python"}[name]
importlib.import_module(name)
have = tuple(int(x) for x in version(dist).split(".")[:2])
sys.exit(0 if have >= tuple(int(x) for x in want.split(".")) else 1)
PY
}
if ((USE_PIP)); then
	if pip_has mesonbuild 1.0 && pip_has mesonpy 0.13; then
		say "meson and meson-python already installed from PyPI"
	else
		say "installing from PyPI for $(python3 --version): ${PIP_PACKAGES[*]}"
		"${SUDO[@]}" python3 -m pip install -q "${PIP_PACKAGES[@]}" ||
			die "pip install failed for: ${PIP_PACKAGES[*]} (network? PyPI?)"
	fi
	hash -r
fi
command -v meson >/dev/null || die "meson not found on PATH after installing it"
say "meson $(meson --version) ($(command -v meson))"

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
# that CI runs: build-asan (AddressSanitizer + UBSan) and
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
