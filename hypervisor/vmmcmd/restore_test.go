package vmmcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// tickerSnapshot snapshots a paused guest that writes dots to its console,
// with a writable disk and a vsock device, and returns the snapshot.
func tickerSnapshot(t *testing.T, dir string) string {
	t.Helper()
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte("disk"), 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "boot.ctl")
	v := startVMM(t, sock, "-kernel", kernel(t, kvmtest.TickerProgram('.')), "-memory", "64", "-console", "none",
		"-control", sock, "-disk", disk+",serial=data", "-vsock", filepath.Join(dir, "boot.vsock"), "-rng=false")
	if err := v.ctl.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap")
	if _, err := v.ctl.Snapshot(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	v.stop(t)
	return snap
}

// editManifest copies the snapshot src to dst (files hard-linked) with its
// manifest and the configuration in it edited.
func editManifest(t *testing.T, src, dst string, edit func(*snapshot.Manifest, *Config)) {
	t.Helper()
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != snapshot.ManifestName {
			if err := os.Link(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(src, snapshot.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	var man snapshot.Manifest
	var cfg Config
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(man.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(&man, &cfg)
	if man.Config, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if b, err = json.Marshal(man); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, snapshot.ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// noneLeft fails t if the disk dir has anything in it or the vsock socket
// exists.
func noneLeft(t *testing.T, what, diskDir, vsock string) {
	t.Helper()
	if ents, err := os.ReadDir(diskDir); err != nil || len(ents) != 0 {
		t.Errorf("%s: the disk dir holds %v (%v)", what, ents, err)
	}
	if _, err := os.Lstat(vsock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: the vsock socket was left behind (%v)", what, err)
	}
}

func waitFile(t *testing.T, path, want string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("%s never showed %q: %q", path, want, b)
		}
	}
}

// TestRestoreConsoleFile: the guest restored by "cube-vmm restore -console
// FILE", from the command line and into a standby, writes its console to
// FILE.
func TestRestoreConsoleFile(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	snap := tickerSnapshot(t, dir)
	sock, con := filepath.Join(dir, "ctl"), filepath.Join(dir, "console.log")
	r := startVMM(t, sock, "restore", "-console", con, "-control", sock, "-disk-dir", t.TempDir(), snap)
	waitFile(t, con, "...")
	r.stop(t)

	sb, sbCon := filepath.Join(dir, "standby"), filepath.Join(dir, "standby-console.log")
	s := startVMM(t, sb, "restore", "-standby", "-control", sb, "-console", sbCon, "-disk-dir", t.TempDir())
	if _, err := s.ctl.Restore(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	waitFile(t, sbCon, "...")
	s.stop(t)
}

// restoreFailures are snapshots whose restore fails: before the machine
// exists (the configuration disagrees with the manifest) and after it
// (KVM, or the saved state disagreeing with a manifest and configuration
// that agree).
func restoreFailures(t *testing.T, dir, snap string) []struct{ name, dir, kvm, want string } {
	t.Helper()
	vcpus := filepath.Join(dir, "vcpus")
	editManifest(t, snap, vcpus, func(m *snapshot.Manifest, c *Config) { m.Shape.VCPUs, c.VCPUs = 2, 2 })
	memory := filepath.Join(dir, "memory")
	editManifest(t, snap, memory, func(m *snapshot.Manifest, c *Config) { c.MemoryMiB = 128 })
	return []struct{ name, dir, kvm, want string }{
		{"no KVM device", snap, "/nonexistent/kvm", "restore " + snap + ": kvm: open /nonexistent/kvm: no such file"},
		{"state of fewer vCPUs", vcpus, "", "restore " + vcpus + ": state has 1 vCPUs, VM has 2: " + snapshot.ErrMismatch.Error()},
		{"configuration of another memory size", memory, "", "snapshot " + memory + ": configuration has 128 MiB"},
	}
}

// TestRestoreFailureLeavesNothing: a "cube-vmm restore" that fails exits 1
// with the reason (not a Go panic) and leaves no working disk copy and no
// vsock socket.
func TestRestoreFailureLeavesNothing(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	snap := tickerSnapshot(t, dir)
	for _, c := range restoreFailures(t, dir, snap) {
		disks, vs := t.TempDir(), filepath.Join(dir, "restore.vsock")
		args := []string{"restore", "-console", "none", "-disk-dir", disks, "-vsock", vs}
		if c.kvm != "" {
			args = append(args, "-kvm", c.kvm)
		}
		rc, _, errOut := run(append(args, c.dir)...)
		if rc != ExitFailure || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "goroutine") {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, rc, errOut, ExitFailure, c.want)
		}
		noneLeft(t, c.name, disks, vs)
	}
}

// TestStandbyRestoreFailureStaysOnStandby: a standby whose restore op fails
// answers the reason, leaves no working disk copy and no vsock socket, and
// stays on standby; a good restore then succeeds.
func TestStandbyRestoreFailureStaysOnStandby(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	snap := tickerSnapshot(t, dir)
	sb, disks, vs := filepath.Join(dir, "standby"), t.TempDir(), filepath.Join(dir, "standby.vsock")
	s := startVMM(t, sb, "restore", "-standby", "-control", sb, "-console", "none", "-disk-dir", disks, "-vsock", vs)
	for _, c := range restoreFailures(t, dir, snap) {
		if c.kvm != "" {
			continue // a standby's KVM VM is made before any restore op
		}
		if _, err := s.ctl.Restore(t.Context(), c.dir, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: restore op: %v, want %q", c.name, err, c.want)
		}
		var info struct{ State string }
		if err := s.ctl.Info(t.Context(), &info); err != nil || info.State != "standby" {
			t.Fatalf("%s: after the failed restore: %q (%v)\n%s", c.name, info.State, err, s.stderr)
		}
		noneLeft(t, c.name, disks, vs)
	}
	if _, err := s.ctl.Restore(t.Context(), snap, false); err != nil {
		t.Fatalf("restore after the failed ones: %v\n%s", err, s.stderr)
	}
	s.stop(t)
}

func TestOpenConsole(t *testing.T) {
	var stdout bytes.Buffer
	if w, closeConsole, err := openConsole("stdout", &stdout); err != nil || w != &stdout {
		t.Errorf("stdout: %v %v", w, err)
	} else {
		closeConsole()
	}
	if w, closeConsole, err := openConsole("none", &stdout); err != nil || w != nil {
		t.Errorf("none: %v %v", w, err)
	} else {
		closeConsole()
	}
	p := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(p, []byte("old\n"), 0o644)
	w, closeConsole, err := openConsole(p, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("new\n"))
	closeConsole()
	if b, _ := os.ReadFile(p); string(b) != "old\nnew\n" {
		t.Errorf("console file %q, want it appended to", b)
	}
	if _, _, err := openConsole(filepath.Join(p, "sub"), &stdout); err == nil || !strings.HasPrefix(err.Error(), "console: ") {
		t.Errorf("console under a file: %v", err)
	}
}
