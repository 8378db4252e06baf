package sandbox_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

// A container's rootfs disk is mounted with barrier=0 (no flushes, so no
// fsync on the host) unless RootfsFsync keeps ext4's barriers.
func TestRootfsMountOptions(t *testing.T) {
	for _, fsync := range []bool{false, true} {
		agent := sandboxtest.NewAgent()
		sb, err := sandbox.New(sandbox.Options{ID: "fs", Dir: filepath.Join(t.TempDir(), "fs"), DiskSlots: 2,
			VMM: sandboxtest.NewVMM(agent), Dial: sandboxtest.Dialer(agent), BootTimeout: time.Second, RootfsFsync: fsync})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := sb.Start(ctx, "/img/a.ext4", "a"); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ id, img, serial string }{{"a", "/img/a.ext4", "cube-slot-0"}, {"b", "/img/b.ext4", "cube-slot-1"}} {
			if _, err := sb.AttachRootfs(ctx, c.id, c.img); err != nil {
				t.Fatal(err)
			}
			opts := agent.MountOptions(c.serial)
			if !slices.Contains(opts, "noinit_itable") || slices.Contains(opts, "barrier=0") == fsync {
				t.Errorf("rootfs_fsync %v: %s mounted with %q", fsync, c.serial, opts)
			}
		}
		sb.Stop(ctx)
	}
}
