// Package vmm holds the Linux-guest end-to-end tests and boot benchmarks of the VMM, run inside the test host
// (nested KVM). The same Debian kernel and the same marker initramfs are booted by every VMM compared, so
// their boot-to-userspace times can be set side by side.
package vmm

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/testhost"
)

// Paths inside the test host.
const (
	guestKernel   = "/cube/guest/vmlinuz"
	markerInitrd  = "/cube/guest/marker.cpio.gz"
	devicesInitrd = "/cube/guest/devices.cpio.gz"
	cubeVMM       = sandboxenv.CubeVMM
)

// devicesModules are what the devices guest loads (with their dependencies) to see our virtio devices.
var devicesModules = []string{"virtio_pci", "virtio_blk", "virtio_rng", "vmw_vsock_virtio_transport", "virtio_net", "virtiofs"}

// bootMarker is what the marker guest's /init prints first thing in userspace.
const bootMarker = "CUBE-BOOT-MARKER"

// The marker guest's /init: announce userspace, then power off — or, with cube_hold=1 on the kernel command
// line (the kernel hands such parameters to /init as environment variables), stay up, so that the boot's KVM
// counters can still be read (bootBreakdown).
const markerInit = `#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
echo ` + bootMarker + ` >/dev/console
[ -n "$cube_hold" ] && /bin/busybox sleep 600
/bin/busybox poweroff -f
`

func TestMain(m *testing.M) {
	if testhost.Inside() {
		testhost.Main(m, testhost.Options{})
		return
	}
	files, cleanup, err := prepareGuest()
	if err == nil {
		err = buildVMM(files, cleanup)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
		os.Exit(1)
	}
	// The benchmarks' knobs reach the test binary inside the test host.
	var envs []string
	for _, k := range []string{"BOOT_RUNS", "NET_BENCH_MIB", "NET_BENCH_REPS", "NET_BENCH_RTTS", "NET_BENCH_PEERS"} {
		if v, ok := os.LookupEnv(k); ok {
			envs = append(envs, k+"="+v)
		}
	}
	code := testhost.RunMain(m, testhost.Options{
		Env:     envs,
		Timeout: 25 * time.Minute,                                // BenchmarkCubeVMMVsQEMU: 7 VMMs × BOOT_RUNS boots, then 4 held boots
		Tools:   []string{"qemu-system-x86_64", "socat", "runc"}, // runc: the net benchmark's native baseline
		Modules: []string{"tun", "veth"},                         // taps for TestGuestNet and the net benchmark; its veth
		Files:   files,
	})
	cleanup() // not deferred: os.Exit skips deferred calls
	os.Exit(code)
}

// prepareGuest builds the guest artifacts on the host and returns where they go inside the test host.
func prepareGuest() (map[string]string, func(), error) {
	k, err := guestimage.FetchKernel(context.Background(), testhost.DefaultCacheDir())
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "cube-vmm-e2e-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	r := guestimage.NewInitramfs()
	if err := r.File("bin/busybox", "/bin/busybox"); err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := r.Bytes("init", []byte(markerInit), 0o755); err != nil {
		cleanup()
		return nil, nil, err
	}
	var buf bytes.Buffer
	if err := r.WriteTo(&buf, true); err != nil {
		cleanup()
		return nil, nil, err
	}
	initrd := filepath.Join(dir, "marker.cpio.gz")
	if err := os.WriteFile(initrd, buf.Bytes(), 0o644); err != nil {
		cleanup()
		return nil, nil, err
	}
	devices := filepath.Join(dir, "devices.cpio.gz")
	if err := writeDevicesInitrd(k, devices); err != nil {
		cleanup()
		return nil, nil, err
	}
	nb, err := prepareNetBench(k, dir)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	files := map[string]string{
		guestKernel:   k.Vmlinuz,
		markerInitrd:  initrd,
		devicesInitrd: devices,
		cubeVMM:       filepath.Join(dir, "cube-vmm"),
		// QEMU's firmware (SeaBIOS, option ROMs), for the peer VMM.
		"/usr/share/qemu":    "/usr/share/qemu",
		"/usr/share/seabios": "/usr/share/seabios",
	}
	maps.Copy(files, nb)
	return files, cleanup, nil
}

// buildVMM builds cube-vmm from this checkout to where files says it goes.
func buildVMM(files map[string]string, cleanup func()) error {
	if err := sandboxenv.GoBuild(files[cubeVMM], "github.com/cube-runtime/cube/cmd/cube-vmm"); err != nil {
		cleanup()
		return err
	}
	return nil
}

// The devices guest's /init: load the virtio drivers, announce userspace, run the scenario named by
// cube.scenario= on the command line, power off. Results are "KEY=value" lines on the console.
const devicesInit = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /usr/bin /usr/sbin /sbin
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox --install -s
for m in $(cat /modules.order); do insmod "/lib/modules/$m" || echo "insmod $m failed"; done
echo ` + bootMarker + `
scenario=$(sed -n 's/.*cube\.scenario=\([a-z0-9-]*\).*/\1/p' /proc/cmdline)
echo "SCENARIO=$scenario"
case "$scenario" in
devices)
	echo "CPUS=$(grep -c ^processor /proc/cpuinfo)"
	echo "SERIAL=$(cat /sys/block/vda/serial)"
	echo "READ=$(dd if=/dev/vda bs=16 count=1 2>/dev/null)"
	echo guest-wrote-this | dd of=/dev/vda bs=512 seek=8 conv=sync,fsync 2>/dev/null && echo "WRITE=ok"
	if echo x | dd of=/dev/vdb bs=512 count=1 conv=sync,fsync 2>/dev/null; then echo "RO_WRITE=succeeded"; else echo "RO_WRITE=refused"; fi
	echo "RO_READ=$(dd if=/dev/vdb bs=11 count=1 2>/dev/null)"
	echo "RNG=$(cat /sys/class/misc/hw_random/rng_current)"
	echo "RNG_BYTES=$(head -c 32 /dev/hwrng | od -An -tx1 | tr -d ' \n' | wc -c)"
	# vsock: an echo server on port 5000 for the host, and a guest-initiated connection to host port 6000
	# (the host listens on <uds>_6000 before the VM starts).
	timeout 120 socat VSOCK-LISTEN:5000,reuseaddr EXEC:cat &
	sleep 0.5
	echo "VSOCK_LISTENING=5000"
	echo "guest-to-host" | timeout 60 socat - VSOCK-CONNECT:2:6000 && echo "VSOCK_DIAL=ok"
	wait
	;;
net)
	# virtio-net on a tap whose host side is 10.0.2.2/24 (TestGuestNet).
	echo "MAC=$(cat /sys/class/net/eth0/address)"
	echo "FEATURES=$(cat /sys/class/net/eth0/device/features)"
	ip link set lo up
	ip link set eth0 up
	ip addr add 10.0.2.15/24 dev eth0
	if ping -c 3 -W 10 10.0.2.2 >/dev/null; then echo "PING=ok"; else echo "PING=failed"; fi
	echo "REPLY=$(echo hello-from-guest | timeout 60 nc 10.0.2.2 7000)"
	echo "BULK_OUT=$(dd if=/dev/zero bs=65536 count=64 2>/dev/null | timeout 120 nc 10.0.2.2 7001)"
	echo "BULK_IN=$(timeout 120 nc 10.0.2.2 7002 </dev/null | wc -c)"
	echo "RX_ERRORS=$(cat /sys/class/net/eth0/statistics/rx_errors)"
	;;
vmgenid)
	# The VM generation id (TestGuestVMGenID): the ACPI devices the kernel found, then, every second, a
	# sample: the 16 bytes at the address VGEN.ADDR names (read through /dev/mem: e820-reserved, below 1 MiB),
	# the count of the GED's interrupt, and 16 bytes of /dev/urandom.
	d=/sys/bus/acpi/devices
	echo "VMGENID_HID=$(cat $d/VMGENCTR:00/hid 2>/dev/null)"
	echo "VMGENID_PATH=$(cat $d/VMGENCTR:00/path 2>/dev/null)"
	echo "VMGENID_DRIVER=$(readlink $d/VMGENCTR:00/driver 2>/dev/null | sed 's,.*/,,')"
	echo "GED_HID=$(cat $d/ACPI0013:00/hid 2>/dev/null)"
	echo "GED_DRIVER=$(readlink /sys/bus/platform/devices/ACPI0013:00/driver 2>/dev/null | sed 's,.*/,,')"
	n=0
	while true; do
		n=$((n+1))
		id=$(dd if=/dev/mem bs=16 skip=$((0xfe000/16)) count=1 2>/dev/null | od -An -tx1 | tr -d ' \n')
		ged=$(awk '/ACPI:Ged/ { s = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i; print s }' /proc/interrupts)
		rnd=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
		echo "GEN=$n ${id:-none} ${ged:-none} $rnd"
		sleep 1
	done
	;;
virtiofs)
	# virtio-fs (TestGuestVirtioFS): the host shares a directory as tag share0.
	mkdir -p /mnt
	if mount -t virtiofs share0 /mnt; then echo "MOUNT=ok"; else echo "MOUNT=failed"; fi
	echo "HOST_FILE=$(cat /mnt/host.txt)"
	echo guest-wrote-this >/mnt/guest.txt && sync && echo "GUEST_WRITE=ok"
	mkdir /mnt/gdir && echo tree >/mnt/gdir/f && mv /mnt/gdir/f /mnt/gdir/g && rm /mnt/doomed && echo "TREE=ok"
	echo "LIST=$(ls /mnt | tr '\n' ' ')"
	echo "ESC_REL=$(cat /mnt/esc-rel 2>/dev/null || echo refused)"
	echo "ESC_ABS=$(cat /mnt/esc-abs 2>/dev/null || echo refused)"
	echo "ESC_DOTDOT=$(cat /mnt/../outside/secret 2>/dev/null || echo refused)"
	echo "ESC_WRITE=$( (echo pwned >/mnt/esc-rel) 2>/dev/null && echo written || echo refused)"
	# Snapshots while mounted: the guest holds host.txt open (fd 3) and waits; the host snapshots, writes
	# host-after.txt in the share, rolls the VM back in place to the snapshot and creates go. The rolled-back
	# guest reads through the fd it held, sees the host's file (the share is not rolled back), unmounts, and
	# the host snapshots again (unmounted), then stops the VM.
	exec 3</mnt/host.txt
	echo "MOUNTED_WAITING=1"
	n=0
	while [ ! -e /mnt/go ] && [ $n -lt 300 ]; do sleep 1; n=$((n+1)); done
	echo "HELD_READ=$(cat <&3)"
	exec 3<&-
	echo "HOST_AFTER=$(cat /mnt/host-after.txt 2>&1)"
	echo "REREAD=$(cat /mnt/host.txt 2>&1)"
	if umount /mnt; then echo "UMOUNT=ok"; else echo "UMOUNT=failed"; fi
	echo "UNMOUNTED_WAITING=1"
	sleep 600
	;;
memfill)
	# Guest RAM with content (TestCubeVMMHugeTLB): 24 MiB of random bytes in the initramfs (guest RAM), then,
	# every second, a sample: their md5.
	dd if=/dev/urandom of=/fill bs=1M count=24 2>/dev/null
	n=0
	while true; do
		n=$((n+1))
		echo "FILL=$n $(md5sum </fill | cut -c1-32)"
		sleep 1
	done
	;;
reboot) reboot -f ;;
panic) echo c >/proc/sysrq-trigger ;;
esac
poweroff -f
`

func writeDevicesInitrd(k *guestimage.Kernel, dst string) error {
	r, err := modulesInitrd(k, devicesInit, devicesModules)
	if err != nil {
		return err
	}
	socat, err := exec.LookPath("socat")
	if err != nil {
		return fmt.Errorf("socat is needed in the devices guest: apt-get install socat")
	}
	if err := r.Program("usr/bin/socat", socat); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := r.WriteTo(&buf, true); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

// modulesInitrd is an initramfs with busybox, init as /init, and modules (with their dependencies) in
// /lib/modules, listed in load order in /modules.order.
func modulesInitrd(k *guestimage.Kernel, init string, modules []string) (*guestimage.Initramfs, error) {
	r := guestimage.NewInitramfs()
	if err := r.File("bin/busybox", "/bin/busybox"); err != nil {
		return nil, err
	}
	if err := r.Bytes("init", []byte(init), 0o755); err != nil {
		return nil, err
	}
	mods, err := k.Modules(modules...)
	if err != nil {
		return nil, err
	}
	var order []string
	for _, m := range mods {
		if err := r.File("lib/modules/"+filepath.Base(m), filepath.Join(k.ModulesDir(), m)); err != nil {
			return nil, err
		}
		order = append(order, filepath.Base(m))
	}
	if err := r.Bytes("modules.order", []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	return r, nil
}
