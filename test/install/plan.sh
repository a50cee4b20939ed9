#!/usr/bin/env bash
# shellcheck disable=SC2015 # "check && check || fail" is meant throughout
# plan.sh — scripts/install.sh's choices on each system it supports, read
# from `install.sh --plan` with a made-up os-release file (the Ubuntu
# releases cannot be run here): where meson and meson-python come from, and
# which systems it refuses.
#
#   plan.sh SOURCE_DIR
set -euo pipefail
src=$1
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

plan() { # ID VERSION_ID: install.sh --plan's output (and its status in $?)
	printf 'ID=%s\nVERSION_ID="%s"\n' "$1" "$2" >"$tmp/os-release"
	OS_RELEASE=$tmp/os-release "$src/scripts/install.sh" --plan 2>&1
}
has() { grep -qw -- "$2" <<<"$1"; }

for sys in "debian 12" "debian 13" "ubuntu 24.04"; do
	# shellcheck disable=SC2086
	out=$(plan $sys) || fail "$sys refused: $out"
	apt=$(grep '^apt:' <<<"$out")
	has "$apt" meson && has "$apt" python3-mesonpy && ! grep -q '^pip:' <<<"$out" ||
		fail "$sys: meson and meson-python should come from its packages: $out"
	for p in libcriterion-dev groff-base man-db python3-venv python3-dev pkg-config; do
		has "$apt" "$p" || fail "$sys: $p missing from: $apt"
	done
done
out=$(plan ubuntu 22.04) || fail "ubuntu 22.04 refused: $out"
apt=$(grep '^apt:' <<<"$out")
pip=$(grep '^pip:' <<<"$out") || fail "ubuntu 22.04: no pip step: $out"
! has "$apt" python3-mesonpy && ! has "$apt" meson && has "$apt" python3-pip ||
	fail "ubuntu 22.04: its meson (0.61) and no python3-mesonpy: $apt"
grep -q "meson>=1.0" <<<"$pip" && grep -q "meson-python" <<<"$pip" ||
	fail "ubuntu 22.04: meson and meson-python from PyPI: $pip"
for p in libcriterion-dev python3-venv python3-dev; do
	has "$apt" "$p" || fail "ubuntu 22.04: $p missing from: $apt"
done
for sys in "ubuntu 20.04" "debian 11" "fedora 40"; do
	# shellcheck disable=SC2086
	if out=$(plan $sys); then
		fail "$sys accepted: $out"
	fi
	grep -q "install.sh: error:" <<<"$out" || fail "$sys: refused without saying why: $out"
done
echo "ok: install.sh plans Debian 12/13 and Ubuntu 24.04 from packages, Ubuntu 22.04 with PyPI's meson, refuses older"
