package vmmcmd

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// counterCode counts in RAX and stores it at 0x3000000 forever.
var counterCode = []byte{
	0x48, 0x31, 0xc0, 0x48, 0xff, 0xc0,
	0x48, 0x89, 0x04, 0x25, 0x00, 0x00, 0x00, 0x03,
	0xeb, 0xf3,
}

const counterAddr = 0x3000000

// runUntilAdvanced resumes the paused VM for a while, pauses it and snapshots it into dir-N, longer each
// time (20 ms, doubling, about 5 s in all, so a loaded machine cannot make it flaky), until the guest's
// counter has moved past from. It returns the last counter seen.
func runUntilAdvanced(t *testing.T, ctl *control.Client, dir string, from uint64) uint64 {
	t.Helper()
	var c uint64
	for i, wait := 0, 20*time.Millisecond; i < 8; i, wait = i+1, wait*2 {
		if err := ctl.Resume(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(wait)
		if err := ctl.Pause(t.Context()); err != nil {
			t.Fatal(err)
		}
		d := fmt.Sprintf("%s-%d", dir, i)
		if _, err := ctl.Snapshot(t.Context(), d, false); err != nil {
			t.Fatal(err)
		}
		if c = snapCounter(t, d); c > from {
			return c
		}
	}
	return c
}

// snapConfig is the cube-vmm configuration the snapshot in dir records.
func snapConfig(t *testing.T, dir string) Config {
	t.Helper()
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(snap.Manifest.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func snapCounter(t *testing.T, dir string) uint64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, snapshot.MemoryName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [8]byte
	if _, err := f.ReadAt(b[:], counterAddr); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

type vmm struct {
	rc     chan int
	stderr *bytes.Buffer
	ctl    *control.Client
}

func startVMM(t *testing.T, sock string, args ...string) *vmm {
	t.Helper()
	v := &vmm{rc: make(chan int, 1), stderr: &bytes.Buffer{}}
	go func() {
		var out bytes.Buffer
		v.rc <- Run(args, strings.NewReader(""), &out, lockedBuf{v.stderr})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := control.Dial(t.Context(), sock)
		if err == nil {
			v.ctl = c
			return v
		}
		select {
		case rc := <-v.rc:
			t.Fatalf("cube-vmm exited %d: %s", rc, v.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no control socket: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (v *vmm) stop(t *testing.T) {
	t.Helper()
	v.ctl.Stop(t.Context())
	v.ctl.Close()
	select {
	case rc := <-v.rc:
		if rc != ExitStopped {
			t.Errorf("cube-vmm exited %d, want %d: %s", rc, ExitStopped, v.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cube-vmm did not stop")
	}
}

type lockedBuf struct{ b *bytes.Buffer }

func (l lockedBuf) Write(p []byte) (int, error) { return l.b.Write(p) }

// TestSnapshotRollbackRestoreOps drives snapshot, rollback and restore
// through cube-vmm's control socket with a counting guest and a disk.
func TestSnapshotRollbackRestoreOps(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	orig := bytes.Repeat([]byte("snapshot"), 8192)
	os.WriteFile(disk, orig, 0o644)
	sock := filepath.Join(dir, "ctl")
	v := startVMM(t, sock, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none",
		"-control", sock, "-disk", disk+",serial=data", "-rng=false")
	time.Sleep(100 * time.Millisecond)
	if err := v.ctl.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	s1 := filepath.Join(dir, "s1")
	res, err := v.ctl.Snapshot(t.Context(), s1, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %+v", res)
	c1 := snapCounter(t, s1)
	if c1 == 0 {
		t.Fatal("counter not running before the snapshot")
	}
	// The guest runs on; the disk changes under it.
	v.ctl.Resume(t.Context())
	time.Sleep(50 * time.Millisecond)
	os.WriteFile(disk, bytes.Repeat([]byte("changed!"), 8192), 0o644)
	v.ctl.Pause(t.Context())
	rb, err := v.ctl.Rollback(t.Context(), s1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback: %+v", rb)
	if b, _ := os.ReadFile(disk); !bytes.Equal(b, orig) {
		t.Error("disk not rolled back")
	}
	s2 := filepath.Join(dir, "s2")
	if _, err := v.ctl.Snapshot(t.Context(), s2, false); err != nil {
		t.Fatal(err)
	}
	if c := snapCounter(t, s2); c != c1 {
		t.Fatalf("after rollback the counter is %d, want %d", c, c1)
	}
	// Refusals leave the VM as it was.
	if _, err := v.ctl.Rollback(t.Context(), filepath.Join(dir, "missing")); err == nil {
		t.Error("rollback to a missing snapshot succeeded")
	}
	if _, err := v.ctl.Snapshot(t.Context(), s2, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("snapshot over an existing one: %v", err)
	}
	v.ctl.Resume(t.Context())
	time.Sleep(20 * time.Millisecond)
	v.ctl.Pause(t.Context())
	s3 := filepath.Join(dir, "s3")
	v.ctl.Snapshot(t.Context(), s3, false)
	if c := snapCounter(t, s3); c <= c1 {
		t.Fatalf("counter did not advance after the rollback: %d", c)
	}
	v.stop(t)

	// A new process from the snapshot; its disk copy was deleted.
	os.Remove(disk)
	r := startVMM(t, sock, "restore", "-paused", s1)
	s4 := filepath.Join(dir, "s4")
	if _, err := r.ctl.Snapshot(t.Context(), s4, false); err != nil {
		t.Fatal(err)
	}
	if c := snapCounter(t, s4); c != c1 {
		t.Fatalf("restored counter %d, want %d", c, c1)
	}
	if b, _ := os.ReadFile(disk); !bytes.Equal(b, orig) {
		t.Error("restore did not recreate the disk from the snapshot")
	}
	if c := runUntilAdvanced(t, r.ctl, filepath.Join(dir, "s5"), c1); c <= c1 {
		t.Fatalf("restored counter did not advance: %d", c)
	}
	r.stop(t)
}

func TestRestoreRefusals(t *testing.T) {
	dir := t.TempDir()
	rc, _, errOut := run("restore", filepath.Join(dir, "nothing"))
	if rc != ExitFailure || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing snapshot: %d %q", rc, errOut)
	}
	rc, _, errOut = run("restore")
	if rc != ExitUsage {
		t.Errorf("no dir: %d %q", rc, errOut)
	}
}

// TestRollbackRefusesOtherKernel: a snapshot of a VM with another kernel
// is refused, and the VM keeps running.
func TestRollbackRefusesOtherKernel(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	sockA, sockB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	a := startVMM(t, sockA, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none", "-control", sockA)
	snap := filepath.Join(dir, "snap")
	if _, err := a.ctl.Snapshot(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	other := append([]byte{0x90}, counterCode...) // a nop in front: another kernel image
	b := startVMM(t, sockB, "-kernel", kernel(t, other), "-memory", "64", "-console", "none", "-control", sockB)
	_, err := b.ctl.Rollback(t.Context(), snap)
	if err == nil || !strings.Contains(err.Error(), "kernel sha256") {
		t.Fatalf("rollback to another kernel's snapshot: %v", err)
	}
	t.Log(err)
	var info struct{ State string }
	if err := b.ctl.Info(t.Context(), &info); err != nil || info.State != "running" {
		t.Fatalf("after the refusal the VM is %q (%v)", info.State, err)
	}
	b.stop(t)
}

// TestRestoreStandby: a standby cube-vmm answers info before any VM, refuses
// VM ops and bad restores (staying on standby), restores through the op and
// then controls the restored VM on the same socket; a second restore is
// refused; a standby stopped before a restore exits 12.
func TestRestoreStandby(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl")
	a := startVMM(t, sock, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none", "-control", sock)
	time.Sleep(50 * time.Millisecond)
	a.ctl.Pause(t.Context())
	snap := filepath.Join(dir, "snap")
	if _, err := a.ctl.Snapshot(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	c1 := snapCounter(t, snap)
	a.stop(t)

	sb := filepath.Join(dir, "standby")
	s := startVMM(t, sb, "restore", "-standby", "-control", sb, "-console", "none")
	var info struct{ State string }
	if err := s.ctl.Info(t.Context(), &info); err != nil || info.State != "standby" {
		t.Fatalf("standby info: %q %v", info.State, err)
	}
	if err := s.ctl.Pause(t.Context()); err == nil || !strings.Contains(err.Error(), "restore first") {
		t.Errorf("pause on standby: %v", err)
	}
	if _, err := s.ctl.Restore(t.Context(), "relative/snap", false); err == nil || !strings.Contains(err.Error(), "not absolute") {
		t.Errorf("relative restore dir: %v", err)
	}
	if _, err := s.ctl.Restore(t.Context(), filepath.Join(dir, "missing"), false); err == nil {
		t.Error("restore of a missing snapshot succeeded")
	}
	res, err := s.ctl.Restore(t.Context(), snap, true)
	if err != nil {
		t.Fatalf("restore after a failed one: %v\n%s", err, s.stderr)
	}
	t.Logf("restore: %+v", res)
	if err := s.ctl.Info(t.Context(), &info); err != nil || info.State != "paused" {
		t.Fatalf("after restore -paused the VM is %q (%v)", info.State, err)
	}
	s2 := filepath.Join(dir, "s2")
	if _, err := s.ctl.Snapshot(t.Context(), s2, false); err != nil {
		t.Fatal(err)
	}
	if c := snapCounter(t, s2); c != c1 {
		t.Fatalf("restored counter %d, want %d", c, c1)
	}
	if _, err := s.ctl.Restore(t.Context(), snap, false); err == nil || !strings.Contains(err.Error(), "already runs a VM") {
		t.Errorf("second restore: %v", err)
	}
	if c := runUntilAdvanced(t, s.ctl, filepath.Join(dir, "s3"), c1); c <= c1 {
		t.Fatalf("restored counter did not advance: %d", c)
	}
	s.stop(t)

	// Stopped before any restore.
	idle := startVMM(t, sb, "restore", "-standby", "-control", sb)
	idle.stop(t)
	if _, err := os.Stat(sb); !os.IsNotExist(err) {
		t.Errorf("standby socket left behind: %v", err)
	}
	for _, args := range [][]string{{"restore", "-standby", snap}, {"restore", "-standby"}, {"restore", "-standby", "-paused", "-control", sb}} {
		if rc, _, errOut := run(args...); rc != ExitUsage {
			t.Errorf("%q: exit %d (%s), want %d", args, rc, errOut, ExitUsage)
		}
	}
}
