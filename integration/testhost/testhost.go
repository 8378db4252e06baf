// Package testhost boots the test host: a QEMU machine with software emulation (TCG) and an emulated AMD-V
// CPU whose kernel loads kvm-amd, so that tests needing a real /dev/kvm with nested paging (and a real Linux
// guest) can run on machines whose own /dev/kvm cannot run one. It builds the boot artifacts from Debian
// packages (cached by their inputs), boots them with a payload program on a per-run root disk, streams the
// payload's output back and returns its exit status.
//
// Layout of a run: the kernel and a small initramfs (busybox and the virtio block driver) are cached; stage 1
// mounts the per-run ext4 root disk /dev/vda and switches to it; stage 2 loads KVM and the requested modules,
// runs /cube/payload.sh with its output on the second serial port, and reports the exit status on that port as
// a line tagged with a per-boot nonce. The kernel console goes to the first serial port, kept in a file whose
// tail is shown when anything fails.
package testhost

import (
	"os"
	"slices"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
)

// Environment variables the package reads.
const (
	// EnvInside is set to "1" for payloads running inside the test host.
	EnvInside = "CUBE_TESTHOST"
	// EnvCacheDir overrides where artifacts are cached (default: the user cache dir + /cube).
	EnvCacheDir = guestimage.EnvCacheDir
	// EnvQEMU overrides the QEMU binary (default: qemu-system-x86_64 from PATH).
	EnvQEMU = "CUBE_QEMU"
)

// Defaults: one vCPU per test host, and enough memory for nested guests.
//
// DefaultCPUs is 1: with two vCPUs, multi-threaded TCG crashed the test host's kernel about once in 30 nested
// VM lifecycles (a reschedule IPI taken before KVM restored the host's GS base after a #VMEXIT, or the
// kernel reading its own text wrong); with one vCPU nothing in the emulated machine runs concurrently with
// the vCPU, and no crash was seen (docs/testhost.md, "Measurements"). A 2-vCPU nested guest still boots and
// runs in it. Two 1-vCPU test hosts run side by side on a 2-core machine (lockMachine), so the e2e tier
// keeps both cores busy.
const (
	DefaultMemoryMiB = 4096
	DefaultCPUs      = 1
	DefaultTimeout   = 20 * time.Minute
	DefaultDiskMiB   = 2048 // free space on the root disk beyond its contents
)

// Options describe a test host. The zero value is usable.
type Options struct {
	MemoryMiB int           // guest RAM; default DefaultMemoryMiB
	CPUs      int           // vCPUs; default DefaultCPUs
	Timeout   time.Duration // whole run, boot included; default DefaultTimeout
	DiskMiB   int           // free space on the root disk; default DefaultDiskMiB
	CacheDir  string        // default $CUBE_CACHE_DIR, else the user cache dir + /cube
	// Modules are extra kernel modules (by name, e.g. "loop", "xfs", "vsock") loaded with their
	// dependencies after kvm-amd.
	Modules []string
	// Tools are host programs (names on PATH or absolute paths) installed at the same path inside, with the
	// shared libraries they need.
	Tools []string
	// Files maps a path inside the test host to a host file or directory copied there; an executable file
	// brings the shared libraries it needs.
	Files map[string]string
	// Env is added to the payload's environment ("KEY=value").
	Env []string
	// Platform is the emulated machine and its KVM (defaults from the environment, then Default*).
	Platform Platform
	// Forwards are TCP ports of the machine's 127.0.0.1 forwarded to ports of the test host (QEMU user
	// networking with restrict=on: the test host reaches nothing outside, only these connections come in).
	// With any, the test host gets a virtio-net NIC, eth0 at ForwardGuestAddr, and loads virtio_net.
	Forwards []Forward
}

// Forward is one forwarded port: connections to 127.0.0.1:HostPort on the machine reach GuestPort in the
// test host (its eth0 address, ForwardGuestAddr: a server listening there or on 0.0.0.0 gets them).
type Forward struct {
	HostPort, GuestPort int
}

// ForwardGuestAddr is the test host's eth0 address when it has Forwards (QEMU user networking's default).
const ForwardGuestAddr = "10.0.2.15"

func (o *Options) withDefaults() Options {
	r := *o
	if r.MemoryMiB <= 0 {
		r.MemoryMiB = DefaultMemoryMiB
	}
	if r.CPUs <= 0 {
		r.CPUs = DefaultCPUs
		if n, err := smpFromEnv(); err == nil && n > 0 {
			r.CPUs = n
		}
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultTimeout
	}
	if r.DiskMiB <= 0 {
		r.DiskMiB = DefaultDiskMiB
	}
	if len(r.Forwards) > 0 && !slices.Contains(r.Modules, "virtio_net") {
		r.Modules = append(slices.Clip(r.Modules), "virtio_net")
	}
	r.Platform = r.Platform.withDefaults()
	if r.CacheDir == "" {
		r.CacheDir = DefaultCacheDir()
	}
	return r
}

// DefaultCacheDir is where artifacts are cached when Options.CacheDir is empty.
func DefaultCacheDir() string { return guestimage.DefaultCacheDir() }

// Inside reports whether this process runs inside a test host.
func Inside() bool { return os.Getenv(EnvInside) == "1" }

// Payload is the program a test host runs.
type Payload struct {
	Binary string   // host path of the program; copied in with its shared libraries
	Args   []string // its arguments
}

// Result is what a run produced.
type Result struct {
	ExitCode int           // the payload's exit status
	Output   []byte        // the payload's stdout and stderr, interleaved
	Console  []byte        // the test host's kernel console and init log
	Boot     time.Duration // test host uptime when the payload started (from the init log)
	Wall     time.Duration // QEMU start to exit
	CacheKey string        // the artifacts' key
	WorkDir  string        // the run's temporary directory (removed before Run returns)
}

// ConsoleTail returns the last n lines of the console.
func (r *Result) ConsoleTail(n int) string { return TailLines(r.Console, n) }

// Resolved is the options with every default filled in (the environment's included), as Run uses them.
func (o Options) Resolved() Options { return o.withDefaults() }
