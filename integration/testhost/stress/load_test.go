package stress

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
)

// envLoad turns on host load inside the test host while the lifecycles run (CUBE_STRESS_HOST_LOAD=1): what
// the shim package adds around its nested VMs — processes forking and exiting, a multi-threaded process
// mapping and unmapping memory (TLB-shootdown IPIs between the test host's vCPUs) and disk writes with fsync
// (virtio-blk interrupts). Interrupts reaching a test-host vCPU while it is in KVM_RUN are what the kernel
// failures are suspected to need.
const envLoad = "CUBE_STRESS_HOST_LOAD"

// startLoad runs the load until the returned stop is called.
func startLoad(dir string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f()
			}
		}()
	}
	// Fork, exec and exit.
	run(func() { exec.CommandContext(ctx, "/bin/true").Run() })
	// Two OS threads of this process mapping, touching and unmapping 1 MiB: each munmap flushes the TLB of the
	// other vCPU if a thread of ours last ran there.
	for range 2 {
		run(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for i := 0; i < 64 && ctx.Err() == nil; i++ {
				b, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
				if err != nil {
					return
				}
				for j := 0; j < len(b); j += 4096 {
					b[j] = 1
				}
				syscall.Munmap(b)
			}
		})
	}
	// Small synced writes to the test host's disk.
	f := filepath.Join(dir, "load")
	run(func() {
		if w, err := os.Create(f); err == nil {
			w.Write(make([]byte, 64<<10))
			w.Sync()
			w.Close()
		}
	})
	return func() { cancel(); wg.Wait(); os.Remove(f) }
}
