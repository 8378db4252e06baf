// Package sandboxenv prepares, on the host, what an end-to-end test of a sandbox microVM takes into the test
// host: cube-vmm and other Cube binaries built from this checkout, the guest image (pinned Debian kernel +
// the agent as /init) and a busybox-static ext4 rootfs disk. The agent, shim and snapshot e2e packages share it.
package sandboxenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
	"github.com/cube-runtime/cube/guest-agent/initsys"
	"github.com/cube-runtime/cube/integration/testhost"
)

// Paths inside the test host.
const (
	CubeVMM     = "/cube/bin/cube-vmm"
	GuestKernel = "/cube/guest/vmlinuz"
	GuestInitrd = "/cube/guest/initramfs.cpio.gz"
	RootfsImage = "/cube/guest/rootfs.img"
)

// Motd is /etc/motd of the rootfs disk, for tests to read back from a container.
const Motd = "lower layer says hi\n"

// applets are the busybox links of the rootfs disk.
var applets = []string{"sh", "echo", "cat", "sleep", "hostname", "id", "ls", "kill", "true"}

// Env is a prepared set of artifacts in a temporary directory.
type Env struct {
	Dir string
	// Files maps paths inside the test host to the built files, for testhost.Options.Files.
	Files map[string]string
}

// Options says what a package needs besides the standard artifacts.
type Options struct {
	// Extra are commands for the test host: path inside the test host → Go package.
	Extra map[string]string
	// Rootfs are static commands put into the rootfs disk: path inside the rootfs (e.g. "bin/worker") → Go
	// package.
	Rootfs map[string]string
	// Tools, Files and Timeout go to testhost.Options (Main only); Files are added to the built ones.
	Tools   []string
	Files   map[string]string
	Timeout time.Duration
	// Env are NAME=value pairs set for the tests inside the test host (Main only).
	Env []string
	// Build, when set, makes more files in dir (removed with the rest) and returns them as paths inside the
	// test host → files in dir (MainWith only).
	Build func(dir string) (map[string]string, error)
}

// Prepare builds cube-vmm, the agent, the guest image and the rootfs disk, plus the extra commands
// (path inside the test host → Go package), into a new temporary directory named after prefix.
func Prepare(prefix string, extra map[string]string) (*Env, error) {
	return PrepareWith(prefix, Options{Extra: extra})
}

// PrepareWith is Prepare with options.
func PrepareWith(prefix string, o Options) (*Env, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, Files: map[string]string{
		CubeVMM:     filepath.Join(dir, "cube-vmm"),
		GuestKernel: filepath.Join(dir, "guest", "vmlinuz"),
		GuestInitrd: filepath.Join(dir, "guest", "initramfs.cpio.gz"),
		RootfsImage: filepath.Join(dir, "rootfs.img"),
	}}
	if err := e.prepare(o); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close removes the artifacts.
func (e *Env) Close() { os.RemoveAll(e.Dir) }

// GoBuild builds a static binary of pkg at out.
func GoBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v: %s", pkg, err, b)
	}
	return nil
}

func (e *Env) prepare(o Options) error {
	if err := GoBuild(e.Files[CubeVMM], "github.com/cube-runtime/cube/cmd/cube-vmm"); err != nil {
		return err
	}
	root := filepath.Join(e.Dir, "rootfs")
	for inside, pkg := range o.Rootfs {
		out := filepath.Join(root, filepath.Clean("/"+inside))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		if err := GoBuild(out, pkg); err != nil {
			return err
		}
	}
	for inside, pkg := range o.Extra {
		out := filepath.Join(e.Dir, filepath.Base(inside))
		if err := GoBuild(out, pkg); err != nil {
			return err
		}
		e.Files[inside] = out
	}
	agent := filepath.Join(e.Dir, "cube-agent")
	if err := GoBuild(agent, "github.com/cube-runtime/cube/cmd/cube-agent"); err != nil {
		return err
	}
	if _, err := guestimage.BuildGuest(context.Background(), guestimage.DefaultCacheDir(), filepath.Join(e.Dir, "guest"),
		guestimage.GuestSpec{Init: agent, Modules: initsys.ModuleNames()}); err != nil {
		return err
	}
	return writeRootfs(root, e.Files[RootfsImage])
}

// writeRootfs makes the container rootfs: busybox-static and its applet links (plus whatever is already in
// root), as an ext4 image (mkfs.ext4 -d needs no root).
func writeRootfs(root, img string) error {
	for _, d := range []string{"bin", "proc", "dev", "tmp", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox-static is needed for the rootfs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/motd"), []byte(Motd), 0o644); err != nil {
		return err
	}
	if b, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "rootfs", "-d", root, img, "64M").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, b)
	}
	return nil
}

// Main is a TestMain for packages that need only these artifacts: inside the test host it runs the tests;
// outside it prepares the artifacts, runs the package in one test host and removes them again.
func Main(m *testing.M, prefix string) { MainWith(m, prefix, Options{}) }

// MainWith is Main with options.
func MainWith(m *testing.M, prefix string, o Options) {
	if testhost.Inside() {
		os.Exit(m.Run())
	}
	env, err := PrepareWith(prefix, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
		os.Exit(1)
	}
	more := o.Files
	if o.Build != nil {
		if more, err = o.Build(env.Dir); err != nil {
			env.Close()
			fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
			os.Exit(1)
		}
		for inside, host := range o.Files {
			more[inside] = host
		}
	}
	for inside, host := range more {
		env.Files[inside] = host
	}
	if o.Timeout == 0 {
		o.Timeout = 15 * time.Minute
	}
	code := testhost.RunMain(m, testhost.Options{Timeout: o.Timeout, Tools: o.Tools, Files: env.Files, Env: o.Env})
	env.Close() // not deferred: os.Exit skips deferred calls
	os.Exit(code)
}
