#!/bin/bash
# The test host: QEMU >= 9 from Debian's bookworm-backports. Debian 12's own QEMU 7.2 runs the test host too,
# but its TCG emulation of nested AMD-V froze the test host or crashed nested guests in about half of our CI
# runs (README, "Known problems"); QEMU 10 from backports boots nested guests several times faster and was
# not seen to freeze. Sourced by .ci/deps (root); skipped when a new enough QEMU is already installed.
qemu_major() { qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p'; }
if [ "$(qemu_major || true)" = "" ] || [ "$(qemu_major)" -lt 9 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "qemu.sh: QEMU >= 9 needed; as root: add bookworm-backports to apt's sources and run" \
			"apt-get install -t bookworm-backports --no-install-recommends qemu-system-x86" >&2
		exit 1
	fi
	src=/etc/apt/sources.list.d/bookworm-backports.sources
	if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
		cat >"$src" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	fi
	echo "qemu.sh: installing qemu-system-x86 from bookworm-backports"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
		qemu-system-x86 >/dev/null
fi
echo "qemu.sh: $(qemu-system-x86_64 --version | head -1)"
