#!/bin/bash
# The test host: QEMU 10 from Debian's bookworm-backports, for its firmware (SeaBIOS, option ROMs) and as the
# `CUBE_TESTHOST_QEMU=debian` variant, plus what building the patched variant (the default) needs. Debian 12's
# own QEMU 7.2 froze the test host or crashed nested guests in about half of our CI runs; the backports
# binary still crashed the test host's kernel now and then (docs/testhost.md), which the patched build fixes.
# Sourced by .ci/deps (root); skips what is already installed.
qemu_major() { qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p'; }
ensure_bpo() {
	local src=/etc/apt/sources.list.d/bookworm-backports.sources
	if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
		cat >"$src" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	fi
}
if [ "$(qemu_major || true)" = "" ] || [ "$(qemu_major)" -lt 9 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "qemu.sh: QEMU >= 9 needed; as root: add bookworm-backports to apt's sources and run" \
			"apt-get install -t bookworm-backports --no-install-recommends qemu-system-x86" >&2
		exit 1
	fi
	ensure_bpo
	echo "qemu.sh: installing qemu-system-x86 from bookworm-backports"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
		qemu-system-x86 >/dev/null
fi
echo "qemu.sh: $(qemu-system-x86_64 --version | head -1)"

# CUBE_TESTHOST_QEMU=patched runs a patched build of that same QEMU (integration/testhost/qemubuild.go builds
# it on first use and caches it; docs/testhost.md). What the build needs, installed only when that variant is
# asked for: meson >= 1.5 and pycotap from backports, the rest from bookworm. The firmware stays Debian's.
if [ "${CUBE_TESTHOST_QEMU:-}" = patched ]; then
	qemu_build_pkgs=(ninja-build pkg-config flex bison libglib2.0-dev zlib1g-dev libfdt-dev python3-venv)
	qemu_bpo_pkgs=(meson python3-pycotap)
	qemu_missing=()
	for p in "${qemu_build_pkgs[@]}" "${qemu_bpo_pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || qemu_missing+=("$p")
	done
	meson_ok() { meson --version 2>/dev/null | awk -F. '{exit !($1 > 1 || ($1 == 1 && $2 >= 5))}'; }
	if [ ${#qemu_missing[@]} -gt 0 ] || ! meson_ok; then
		if [ "$(id -u)" != 0 ]; then
			echo "qemu.sh: building the test host's QEMU needs: apt-get install ${qemu_build_pkgs[*]} &&" \
				"apt-get install -t bookworm-backports ${qemu_bpo_pkgs[*]}" >&2
			exit 1
		fi
		ensure_bpo
		echo "qemu.sh: installing what the patched QEMU build needs"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${qemu_build_pkgs[@]}" >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
			"${qemu_bpo_pkgs[@]}" >/dev/null
	fi
	echo "qemu.sh: build tools for the patched QEMU: meson $(meson --version), ninja $(ninja --version)"
fi
