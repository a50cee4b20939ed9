#!/usr/bin/env bash
# check_install.sh — `meson install --destdir` of this build into a scratch
# directory, then what a user of the installed files does with them: the
# header compiles alone (C and C++, without cuda.h), pkg-config finds
# libvpmm and a small program links against the installed library and runs,
# the manual pages render with no warning and document every option the
# tools' --help lists, the bash completion offers those options too, and the
# installed tools report the project's version.
#
#   check_install.sh BUILD_DIR VERSION
#
# Exit 0 when every check passed, 1 at the first that failed (saying which),
# 77 (skipped) only when no C compiler can be found.
set -euo pipefail

build=$1 version=$2
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
ok() { printf 'ok: %s\n' "$*"; }

CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "no C compiler ($CC)"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "meson install --destdir failed"; }

one() { # PATTERN: the one installed file whose path matches
	local found
	found=$(find "$dest" -path "$1" \( -type f -o -type l \))
	[[ -n $found && $(wc -l <<<"$found") -eq 1 ]] || fail "expected one installed $1, found: ${found:-none}"
	printf '%s\n' "$found"
}

header=$(one '*/include/vpmm/vpmm.h')
one '*/include/vpmm/stats.h' >/dev/null
one '*/include/vpmm/version.h' >/dev/null
pc=$(one '*/pkgconfig/libvpmm.pc')
lib=$(one '*/libvpmm.so.'"$version")
libdir=$(dirname "$lib")
[[ -L $libdir/libvpmm.so.${version%%.*} && -L $libdir/libvpmm.so ]] ||
	fail "libvpmm.so.${version%%.*} and libvpmm.so links missing beside $lib"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == "libvpmm.so.${version%%.*}" ]] || fail "soname is '$soname'"
ok "installed: header, libvpmm.pc, $(basename "$lib") with soname $soname"

# ---- the header, alone -------------------------------------------------------------
inc=$(dirname "$(dirname "$header")")
printf '#include <vpmm/vpmm.h>\n' >"$tmp/alone.c"
"$CC" -std=c99 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$inc" "$tmp/alone.c" ||
	fail "vpmm/vpmm.h does not compile alone as C99"
if command -v c++ >/dev/null; then
	cp "$tmp/alone.c" "$tmp/alone.cc"
	c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$inc" "$tmp/alone.cc" ||
		fail "vpmm/vpmm.h does not compile alone as C++11"
	ok "vpmm/vpmm.h compiles alone (C99, C++11)"
else
	ok "vpmm/vpmm.h compiles alone (C99; no c++ here)"
fi

# ---- pkg-config and a program linked against the library ---------------------------------
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR=$dest
unset PKG_CONFIG_LIBDIR
command -v pkg-config >/dev/null || fail "pkg-config not found (scripts/install.sh installs it)"
got=$(pkg-config --modversion libvpmm) || fail "pkg-config does not find libvpmm"
[[ $got == "$version" ]] || fail "pkg-config --modversion libvpmm: $got, not $version"
flags=$(pkg-config --cflags --libs libvpmm)
ok "pkg-config --cflags --libs libvpmm: $flags"

cat >"$tmp/prog.c" <<'EOF'
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <vpmm/vpmm.h>

int main(void)
{
	struct vpmm_stats s;
	char buf[64];
	/* the library loaded is the one the header belongs to */
	if (strcmp(vpmm_version(), VPMM_VERSION) != 0) {
		printf("library %s, header %s\n", vpmm_version(), VPMM_VERSION);
		return 1;
	}
	/* no CUDA call was made: no pool on any device yet */
	if (vpmm_shim_stats(0, &s) != -ENODEV || vpmm_shim_stats_json(0, buf, sizeof buf) != -ENODEV ||
	    vpmm_shim_layout(0, buf, sizeof buf, 0) != -ENODEV || vpmm_shim_stats(0, NULL) != -EINVAL ||
	    vpmm_shim_trim(0, 0, 0) != -ENODEV || vpmm_shim_trim(-1, 0, VPMM_TRIM_WAIT) != 0 ||
	    vpmm_shim_trim(-1, 0, 2) != -EINVAL ||
	    vpmm_shim_hook_calls("no such hook") != ~0ULL || vpmm_shim_hook_calls("cudaMalloc") != 0 ||
	    strcmp(vpmm_shim_socket(), "") != 0) {
		printf("unexpected answers without a pool\n");
		return 1;
	}
	printf("vpmm %s\n", vpmm_version());
	return 0;
}
EOF
# shellcheck disable=SC2086
"$CC" -std=c99 -Wall -Werror "$tmp/prog.c" $flags -o "$tmp/prog" ||
	fail "a program does not link with pkg-config's flags"
readelf -d "$tmp/prog" | grep -q "NEEDED.*\[$soname\]" || fail "the program does not need $soname"
out=$(LD_LIBRARY_PATH=$libdir VPMM_SOCKET=off "$tmp/prog") || fail "the linked program: $out"
[[ $out == "vpmm $version" ]] || fail "the linked program printed: $out"
ok "a program built with pkg-config's flags links against $soname and runs"

# ---- the tools ---------------------------------------------------------------------------
for tool in vpmm-dump vpmm-replay; do
	exe=$(one "*/bin/$tool")
	v=$("$exe" --version) || fail "$tool --version failed"
	[[ $v == "$tool $version"* ]] || fail "$tool --version: $v"
done
ok "installed vpmm-dump and vpmm-replay report $version"

# ---- manual pages ----------------------------------------------------------------------------
render() { # PAGE: the page as text, 80 columns; fails on any roff warning
	local page=$1 text
	if ! command -v groff >/dev/null && ! command -v man >/dev/null; then
		fail "neither man nor groff here (scripts/install.sh installs man-db and groff-base)"
	fi
	if command -v groff >/dev/null; then
		groff -man -t -ww -z -Tutf8 "$page" 2>"$tmp/groff.err" || fail "groff failed on $page"
		[[ ! -s $tmp/groff.err ]] || fail "groff warns on $page: $(cat "$tmp/groff.err")"
	fi
	if command -v man >/dev/null; then
		text=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -l "$page" 2>"$tmp/man.err") ||
			fail "man -l $page failed: $(cat "$tmp/man.err")"
	else
		text=$(groff -man -t -Tutf8 -rLL=80n "$page" | sed 's/.\x08//g')
	fi
	printf '%s\n' "$text"
}

declare -A want_name=(
	[man1/vpmm-dump.1]='vpmm-dump - show the GPU memory pool'
	[man1/vpmm-replay.1]='vpmm-replay - replay a GPU allocation log'
	[man7/libvpmm.7]='libvpmm - a GPU memory pool'
)
for p in "${!want_name[@]}"; do
	page=$(one "*/man/$p")
	render "$page" | tr -s " " >"$tmp/page.txt" # justified: single spaces
	grep -q "^NAME" "$tmp/page.txt" || fail "$p: no NAME section"
	grep -qF "${want_name[$p]}" "$tmp/page.txt" || fail "$p: NAME line is not '${want_name[$p]}'"
	grep -qF "libvpmm $version" "$tmp/page.txt" || fail "$p: footer lacks 'libvpmm $version'"
	case $p in
	*vpmm-dump.1 | *vpmm-replay.1)
		tool=$(basename "$p" .1)
		# every long option of --help is documented
		for o in $("$build/tools/$tool" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
			grep -qF -- "$o" "$tmp/page.txt" || fail "$p does not document $o (in $tool --help)"
		done
		;;
	*libvpmm.7)
		for v in VPMM_PAGES VPMM_PAGE_SIZE VPMM_LOG VPMM_RELEASE_THRESHOLD; do
			grep -q "^ *$v (" "$tmp/page.txt" || fail "$p: no entry for $v in SETTINGS"
		done
		;;
	esac
done
ok "man pages render with no warning: ${!want_name[*]}"

# ---- bash completion ----------------------------------------------------------------------------
comp=$(one '*/share/bash-completion/completions/vpmm-dump')
bash -n "$comp" || fail "$comp: not valid bash"
complete_words() { # WORDS...: what the completion offers for the last word
	# shellcheck disable=SC2016
	bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
		_vpmm_dump; printf "%s\n" "${COMPREPLY[@]}"' _ "$comp" "$@"
}
offered=$(complete_words vpmm-dump --)
for o in $("$build/tools/vpmm-dump" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
	grep -qx -- "$o" <<<"$offered" || fail "the completion does not offer $o"
done
[[ $(complete_words vpmm-dump --color "" | sort | tr '\n' ' ') == "always auto never " ]] ||
	fail "the completion of --color"
mkdir -p "$tmp/run/vpmm"
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$tmp/run/vpmm/4242.sock"
[[ $(XDG_RUNTIME_DIR=$tmp/run complete_words vpmm-dump 42) == 4242 ]] ||
	fail "the completion does not offer the pid of a socket"
ok "bash completion offers every option of vpmm-dump --help, --color's values and socket pids"
