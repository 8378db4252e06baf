#!/bin/sh
# Test host stage 2 (on the root disk): mount the usual filesystems, load KVM and the requested modules, run
# the payload with its output on ttyS1, then report its exit status as a line tagged with this boot's nonce
# and power off. The host reads that line; without it, the run failed.
export PATH=/cube/payload/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm /run /tmp /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs run /run
mount -t tmpfs -o size=75% tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
hostname cube-testhost
ip link set lo up 2>/dev/null
nonce=$(sed -n 's/.*cube\.nonce=\([0-9a-f]*\).*/\1/p' /proc/cmdline)
fail() {
	echo "cube-testhost: $*"
	echo "cube-testhost: exit $nonce 125" >/dev/ttyS1
	sync
	poweroff -f
}
# /cube/modparams: "MODULE PARAM=VALUE ..." lines (Platform.ModuleParams) for insmod.
for m in $(cat /cube/modules.order); do
	name=$(basename "$m" .ko | tr - _)
	params=$(sed -n "s/^$name //p" /cube/modparams 2>/dev/null)
	# shellcheck disable=SC2086
	insmod "/lib/modules/$(uname -r)/$m" $params || fail "insmod $m $params failed"
	[ -n "$params" ] && echo "cube-testhost: $name loaded with $params"
done
# No background remapping of nested guests' memory: khugepaged collapses, compaction and NUMA balancing move
# pages under a running nested guest, and every move must reach the emulated CPU's nested TLB as a flush.
for f in /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; do
	[ -w "$f" ] && echo never >"$f"
done
[ -w /proc/sys/vm/compaction_proactiveness ] && echo 0 >/proc/sys/vm/compaction_proactiveness
[ -w /proc/sys/kernel/numa_balancing ] && echo 0 >/proc/sys/kernel/numa_balancing
# What KVM runs with, on the console (the stability measurements compare platforms by it).
echo "cube-testhost: kvm_amd $(for p in npt nested vgif vls avic pause_filter_count; do printf '%s=%s ' $p "$(cat /sys/module/kvm_amd/parameters/$p 2>/dev/null)"; done)svm-flags: $(grep -o -w 'svm\|npt\|vgif\|nrip_save\|v_vmsave_vmload\|avic' /proc/cpuinfo | sort -u | tr '\n' ' ')"
[ -c /dev/kvm ] || fail "/dev/kvm is missing after loading kvm-amd (does the CPU model have svm?)"
stty -F /dev/ttyS1 raw -echo
echo "cube-testhost: payload starts at $(cut -d' ' -f1 /proc/uptime)s"
cd /cube/work
# While the payload runs, show what runs every minute on the console: when a run hangs, the console tail
# the host prints says where.
( while sleep 60; do
	echo "cube-testhost: still running at $(cut -d' ' -f1 /proc/uptime)s, load $(cut -d' ' -f1-3 /proc/loadavg)"
	ps -o pid,ppid,stat,rss,args | grep -v ' \[' | tail -20
done ) >/dev/console 2>&1 &
watchdog=$!
sh /cube/payload.sh </dev/null >/dev/ttyS1 2>&1
rc=$?
kill $watchdog 2>/dev/null
echo "cube-testhost: payload ended with status $rc at $(cut -d' ' -f1 /proc/uptime)s"
sync
echo "cube-testhost: exit $nonce $rc" >/dev/ttyS1
poweroff -f
