#!/usr/bin/env bash
# gpu_build.sh — scripts/gpu-build.sh, which the GPU scripts use where there
# is no meson, still builds what meson builds: libvpmm.so with the same
# exported symbols and version, and both tools reporting the same version.
#
#   gpu_build.sh SOURCE_DIR BUILD_DIR VERSION
#
# Exit 0, or 1 naming what differs; 77 (skipped) without gcc or the CUDA
# headers that gpu-build.sh looks for (CUDA_HOME, else /usr/local/cuda).
set -euo pipefail
src=$1 build=$2 version=$3
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

command -v gcc >/dev/null || { echo "no gcc"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export VPMM_BUILD_GEN=$tmp/gen
# shellcheck source=scripts/gpu-build.sh
. "$src/scripts/gpu-build.sh"
[[ -f $VPMM_BUILD_CUDA/include/cuda.h ]] || { echo "no $VPMM_BUILD_CUDA/include/cuda.h"; exit 77; }

[[ $(vpmm_version_of "$src") == "$version" ]] ||
	fail "vpmm_version_of reads '$(vpmm_version_of "$src")' from meson.build, meson says $version"
vpmm_build_lib "$tmp/libvpmm.so" || fail "vpmm_build_lib failed"
for tool in vpmm-dump vpmm-replay; do
	vpmm_build_tool $tool "$tmp/$tool" || fail "vpmm_build_tool $tool failed"
done
exports() { nm -D --defined-only "$1" | awk '{print $3}' | sort; }
diff <(exports "$build/shim/libvpmm.so") <(exports "$tmp/libvpmm.so") ||
	fail "gpu-build.sh's libvpmm.so exports other symbols than meson's (diff above)"
v=$("$tmp/vpmm-dump" --version)
[[ $v == "vpmm-dump $version "* ]] || fail "gpu-build.sh's vpmm-dump --version: $v"
v=$("$tmp/vpmm-replay" --version)
[[ $v == "vpmm-replay $version" ]] || fail "gpu-build.sh's vpmm-replay --version: $v"
# the library's own version, through the exported function
cat >"$tmp/ver.c" <<'EOC'
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	const char *(*fn)(void) = h ? (const char *(*)(void))dlsym(h, "vpmm_version") : NULL;
	if (!fn)
		return 1;
	puts(fn());
	return 0;
}
EOC
gcc "$tmp/ver.c" -ldl -o "$tmp/ver"
v=$("$tmp/ver" "$tmp/libvpmm.so") || fail "vpmm_version not found in gpu-build.sh's libvpmm.so"
[[ $v == "$version" ]] || fail "gpu-build.sh's libvpmm.so says version $v"
echo "ok: gpu-build.sh builds libvpmm.so $version with meson's exports, vpmm-dump and vpmm-replay"
