// Package snapshot is the end-to-end test of VM snapshot, in-place rollback and restore: inside the test host,
// cube-vmm boots the guest image with the agent, a worker (a static Go program in the rootfs, ./worker) counts
// in memory, and the test snapshots, kills the worker, rolls back and restores into a new cube-vmm process,
// checking the worker carries on from its saved memory. Its benchmarks (bench_test.go) set cube-vmm's
// snapshot, rollback and restore beside QEMU's migrate-to-file and -incoming in the same test host.
package snapshot

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/integration/sandboxenv"
)

// Paths inside the test host.
const (
	cubeVMM     = sandboxenv.CubeVMM
	guestKernel = sandboxenv.GuestKernel
	guestInitrd = sandboxenv.GuestInitrd
	rootfsImage = sandboxenv.RootfsImage
	benchInitrd = "/cube/guest/bench.cpio.gz"
)

// workerBin is the worker inside the rootfs disk; workerSock its socket (the container's tmpfs /tmp, which is
// guest memory).
const (
	workerBin  = "/bin/worker"
	workerSock = "/tmp/worker.sock"
)

func TestMain(m *testing.M) {
	o := sandboxenv.Options{
		Rootfs:  map[string]string{workerBin: "github.com/cube-runtime/cube/integration/snapshot/worker"},
		Timeout: 20 * time.Minute,
	}
	flag.Parse()
	// More rollback rounds, to hunt rare failures.
	for _, k := range []string{"CUBE_E2E_ROLLBACK_ROUNDS", "CUBE_E2E_ALTERNATE_ROLLBACKS"} {
		if v := os.Getenv(k); v != "" {
			o.Env = append(o.Env, k+"="+v)
		}
	}
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		// The benchmarks boot the same kernel and bench initramfs in cube-vmm and in QEMU.
		o.Tools = []string{"qemu-system-x86_64"}
		o.Files = map[string]string{"/usr/share/qemu": "/usr/share/qemu", "/usr/share/seabios": "/usr/share/seabios"}
		o.Timeout = 45 * time.Minute
		o.Build = func(dir string) (map[string]string, error) {
			r := guestimage.NewInitramfs()
			if err := r.File("bin/busybox", "/bin/busybox"); err != nil {
				return nil, err
			}
			if err := r.Bytes("init", []byte(benchInit), 0o755); err != nil {
				return nil, err
			}
			var buf bytes.Buffer
			if err := r.WriteTo(&buf, true); err != nil {
				return nil, err
			}
			p := filepath.Join(dir, "bench.cpio.gz")
			return map[string]string{benchInitrd: p}, os.WriteFile(p, buf.Bytes(), 0o644)
		}
	}
	sandboxenv.MainWith(m, "cube-snapshot-e2e-", o)
}
