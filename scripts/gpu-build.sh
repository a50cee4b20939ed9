# shellcheck shell=bash
# gpu-build.sh — sourced, not run, by the gpu-*.sh scripts: builds libvpmm.so
# and the command-line tools on the device machine, which has gcc and nvcc but
# no meson. One place, so that every GPU script tests the library meson would
# build: the source lists are read from the meson.build files, and the link
# flags are shim/meson.build's (a script that built its own copy once lacked
# -z nodelete).
#
#   vpmm_sources TREE DIR          the .c files DIR/meson.build lists, as paths
#   vpmm_build_lib OUT [TREE]      libvpmm.so at OUT
#   vpmm_build_tool NAME OUT [TREE]  tools/NAME (vpmm-dump, vpmm-replay) at OUT
#
#   vpmm_version_of TREE           the version meson.build's project() sets
#   vpmm_check_tree TREE           status 0 if TREE is a source tree
#
# TREE defaults to the checkout the sourcing script sits in; one given must
# be a source tree (an empty one is refused, not taken for the default).
# Extra compiler flags (-g, ...) come from VPMM_BUILD_CFLAGS. Each returns
# the compiler's status; the compiler's output goes to stderr. The generated header
# vpmm/version.h (meson's configure_file) goes under VPMM_BUILD_GEN
# (default: a directory in $TMPDIR or /tmp named after this shell).

VPMM_BUILD_TREE=${VPMM_BUILD_TREE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
VPMM_BUILD_CUDA=${CUDA_HOME:-${CUDA:-/usr/local/cuda}}

vpmm_sources() {
	local tree=$1 dir=$2
	# The allocator's and the shim's meson.build name the .c files of
	# libvpmm.so: the shim's in the library's list and in the static
	# library of its server (linked whole into it); tools/meson.build names
	# one list per executable (vpmm_tool_sources).
	grep -o "'[A-Za-z0-9_./-]*\.c'" "$tree/$dir/meson.build" | tr -d "'" |
		sed "s|^|$tree/$dir/|" | awk '!seen[$0]++'
}

# The sources of one executable('NAME', [...]) in tools/meson.build, and of
# the static libraries there, which every tool links (json.c).
vpmm_tool_sources() {
	local tree=$1 name=$2
	{
		sed -n "/executable('$name'/,/)/p" "$tree/tools/meson.build"
		sed -n "/static_library(/,/)/p" "$tree/tools/meson.build"
	} | grep -o "'[A-Za-z0-9_./-]*\.c'" | tr -d "'" | sed "s|^|$tree/tools/|" |
		awk '!seen[$0]++'
}

# The version of project() in TREE/meson.build (the one place it is set).
vpmm_version_of() {
	sed -n "s/^[[:space:]]*version[[:space:]]*:[[:space:]]*'\([0-9][0-9.]*\)'.*/\1/p" \
		"$1/meson.build" | head -n 1
}

# Writes vpmm/version.h for TREE as include/vpmm/meson.build makes it, and
# prints the directory to add to the include path (nothing for a tree from
# before the header existed).
vpmm_generated_dir() {
	local tree=$1 v major minor patch dir
	[[ -f $tree/include/vpmm/version.h.in ]] || return 0
	v=$(vpmm_version_of "$tree")
	IFS=. read -r major minor patch <<<"$v"
	if [[ -z $major || -z $minor || -z $patch ]]; then
		echo "gpu-build.sh: no version x.y.z in $tree/meson.build" >&2
		return 1
	fi
	dir=${VPMM_BUILD_GEN:-${TMPDIR:-/tmp}/vpmm-gen-$$}/$(printf '%s' "$tree" | cksum | cut -d' ' -f1)
	mkdir -p "$dir/vpmm" &&
		sed -e "s/@VPMM_VERSION@/$v/" -e "s/@VPMM_VERSION_MAJOR@/$major/" \
			-e "s/@VPMM_VERSION_MINOR@/$minor/" -e "s/@VPMM_VERSION_PATCH@/$patch/" \
			"$tree/include/vpmm/version.h.in" >"$dir/vpmm/version.h" &&
		echo "$dir"
}

# VPMM_BUILD_CFLAGS is split into words on purpose: it holds several flags.
# shellcheck disable=SC2086
vpmm_build_cflags() {
	local tree=$1 gen
	gen=$(vpmm_generated_dir "$tree") || return 1
	# The project's own arguments (meson.build): gnu11, hidden visibility,
	# _GNU_SOURCE; -O2 as debugoptimized; the TLS model allocator/ and
	# shim/ are built with (without it every thread-local access of a hook
	# is a call of __tls_get_addr: an async pair through the shim measured
	# 100-250 ns slower on an H200). The public headers' folder (include/)
	# and the generated one.
	echo -O2 -std=gnu11 -D_GNU_SOURCE -fvisibility=hidden -ftls-model=initial-exec \
		-I"$tree/allocator" -I"$tree/shim" -I"$tree/include" ${gen:+-I"$gen"} \
		-I"$VPMM_BUILD_CUDA/include" ${VPMM_BUILD_CFLAGS:-}
}

# A TREE given but empty (a `$(cd DIR && pwd)` whose cd failed) or not a
# source tree is refused: the default would build this checkout under
# another revision's name.
vpmm_check_tree() {
	[[ -f $1/shim/meson.build && -f $1/allocator/meson.build ]] && return 0
	echo "gpu-build.sh: \"$1\" is not a libvpmm source tree (no shim/ and allocator/ meson.build)" >&2
	return 1
}

vpmm_build_lib() {
	local out=$1 tree=${2-$VPMM_BUILD_TREE}
	vpmm_check_tree "$tree" || return 1
	mkdir -p "$(dirname "$out")"
	# shellcheck disable=SC2046
	# -fexceptions as shim/meson.build: vpmm_torch_malloc throws through it
	gcc $(vpmm_build_cflags "$tree") -fPIC -shared -fexceptions \
		$(vpmm_sources "$tree" allocator) $(vpmm_sources "$tree" shim) \
		-Wl,--version-script="$tree/shim/libvpmm.map" -Wl,-Bsymbolic \
		-Wl,-z,defs -Wl,-z,nodelete -lpthread -ldl -o "$out"
}

vpmm_build_tool() {
	local name=$1 out=$2 tree=${3-$VPMM_BUILD_TREE} src
	vpmm_check_tree "$tree" || return 1
	src=$(vpmm_tool_sources "$tree" "$name")
	if [[ -z $src ]]; then
		echo "gpu-build.sh: tools/meson.build has no executable '$name'" >&2
		return 1
	fi
	mkdir -p "$(dirname "$out")"
	# shellcheck disable=SC2046,SC2086
	gcc $(vpmm_build_cflags "$tree") $src $(vpmm_sources "$tree" allocator) \
		-lpthread -ldl -o "$out"
}
