#!/bin/bash
# hypervisor/: gcc + linux-libc-dev compile the <linux/kvm.h> layout probe;
# acpica-tools (iasl) disassembles our DSDT in hypervisor/acpi tests.
set -euo pipefail
need=()
command -v gcc >/dev/null || need+=(gcc)
[ -f /usr/include/linux/kvm.h ] || need+=(linux-libc-dev)
command -v iasl >/dev/null || need+=(acpica-tools)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
