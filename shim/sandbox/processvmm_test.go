package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/cube-runtime/cube/hypervisor/control"
	"github.com/cube-runtime/cube/hypervisor/vmmcmd"
	"github.com/cube-runtime/cube/shim/sandbox/vmmtest"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake cube-vmm: with CUBE_FAKE_VMM=1 it parses
// the flags ProcessVMM passes, serves the control and hybrid vsock sockets,
// and exits on "stop".
func TestMain(m *testing.M) {
	if os.Getenv("CUBE_FAKE_VMM") == "1" {
		os.Exit(vmmtest.FakeVMMMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeVMMConfig(t *testing.T, dir string) VMConfig {
	return VMConfig{
		Kernel: "/vmlinuz", Initrd: "/initrd", Cmdline: "console=ttyS0", MemoryMiB: 128, VCPUs: 1,
		Disks:     []Disk{{Serial: "cube-slot-0", Path: "/img/rootfs.ext4"}, {Serial: "cube-slot-1", Path: "/stub", ReadOnly: true}},
		VsockPath: filepath.Join(dir, "v.sock"), ControlPath: filepath.Join(dir, "c.sock"),
		ConsolePath: filepath.Join(dir, "console.log"), GuestCID: 3,
	}
}

func newFakeProcessVMM(t *testing.T) *ProcessVMM {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CUBE_FAKE_VMM", "1")
	return &ProcessVMM{Binary: self}
}

func TestArgs(t *testing.T) {
	cfg := fakeVMMConfig(t, "/d")
	got := strings.Join(Args(cfg), " ")
	want := "-kernel /vmlinuz -cmdline console=ttyS0 -memory 128 -vcpus 1 -initrd /initrd " +
		"-disk /img/rootfs.ext4,serial=cube-slot-0 -disk /stub,serial=cube-slot-1,ro " +
		"-vsock /d/v.sock -vsock-cid 3 -control /d/c.sock -console /d/console.log -console-input none"
	if got != want {
		t.Fatalf("args\n got %s\nwant %s", got, want)
	}
	huge := cfg
	huge.HugeTLB = true
	if got := strings.Join(Args(huge), " "); !strings.Contains(got, " -initrd /initrd -hugetlb -disk ") {
		t.Errorf("hugetlb args: %s", got)
	}
	huge.Template = "/tpl"
	if got := strings.Join(Args(huge), " "); strings.Contains(got, "hugetlb") {
		t.Errorf("a restore got -hugetlb: %s", got)
	}
	cfg.Template = "/tpl"
	got = strings.Join(Args(cfg), " ")
	want = "restore -log-level info -control /d/c.sock -vsock /d/v.sock -console /d/console.log -disk-dir /d /tpl"
	if got != want {
		t.Fatalf("template args\n got %s\nwant %s", got, want)
	}
	cfg.DiskPaths = map[string]string{"cube-slot-1": "/b.img", "cube-slot-0": "/a.img"}
	got = strings.Join(Args(cfg), " ")
	want = "restore -log-level info -control /d/c.sock -vsock /d/v.sock -console /d/console.log -disk-dir /d -disk-path cube-slot-0=/a.img -disk-path cube-slot-1=/b.img /tpl"
	if got != want {
		t.Fatalf("restore args\n got %s\nwant %s", got, want)
	}
	// A template restore: the stubs used as they are, the rootfs set before the guest runs.
	tpl := cfg
	tpl.DiskPaths = nil
	tpl.DiskUses = map[string]string{"cube-slot-1": "/d/slot-1.img", "cube-slot-0": "/d/slot-0.img"}
	tpl.DiskSets = map[string]string{"cube-slot-0": "/img/rootfs.ext4"}
	got = strings.Join(Args(tpl), " ")
	want = "restore -log-level info -control /d/c.sock -vsock /d/v.sock -console /d/console.log -disk-dir /d -disk-use cube-slot-0=/d/slot-0.img -disk-use cube-slot-1=/d/slot-1.img -disk-set cube-slot-0=/img/rootfs.ext4 /tpl"
	if got != want {
		t.Fatalf("template restore args\n got %s\nwant %s", got, want)
	}
	// A restore's NICs replace the snapshot's: fds only, the snapshot's MACs stay.
	cfg.Nets, cfg.ReplaceNets = []NIC{{Tap: os.Stdin, MAC: "02:42:0a:58:00:05"}}, true
	got = strings.Join(Args(cfg), " ")
	want = "restore -log-level info -control /d/c.sock -vsock /d/v.sock -console /d/console.log -disk-dir /d -disk-path cube-slot-0=/a.img -disk-path cube-slot-1=/b.img -net fd=3 /tpl"
	if got != want {
		t.Fatalf("restore args with a NIC\n got %s\nwant %s", got, want)
	}
}

func TestProcessVMMLifecycle(t *testing.T) {
	dir := t.TempDir()
	v := newFakeProcessVMM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := fakeVMMConfig(t, dir)
	if err := v.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if v.Pid() <= 0 {
		t.Fatal("no pid")
	}
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.SetDisk(ctx, "cube-slot-1", "/img/other.ext4", false); err != nil {
		t.Fatal(err)
	}
	if err := v.SetDisk(ctx, "cube-slot-1", "/a,b", false); err == nil {
		t.Fatal("comma in disk path: want error")
	}
	// The stand-in serves the real control server: snapshot, and its refusals.
	snap := filepath.Join(dir, "snap")
	if res, err := v.Snapshot(ctx, snap, false); err != nil || res.Dir != snap {
		t.Fatalf("snapshot: %+v %v", res, err)
	}
	if _, err := v.Snapshot(ctx, snap, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("snapshot over an existing one: %v", err)
	}
	if _, err := v.Snapshot(ctx, "rel/snap", false); err == nil || !strings.Contains(err.Error(), `dir "rel/snap" is not absolute`) {
		t.Fatalf("relative snapshot dir: %v", err)
	}
	inc := filepath.Join(dir, "snap-inc")
	if _, err := v.Snapshot(ctx, inc, true); err != nil {
		t.Fatalf("incremental snapshot: %v", err)
	}
	c, err := v.DialVsock(ctx, 1024)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	c.Close()
	if err := v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	<-v.Wait()
	// cube-vmm exits 12 when stopped through its control socket.
	if e := v.Exit(); e.Status != 12 {
		t.Fatalf("exit %+v", e)
	}
	log, _ := os.ReadFile(cfg.ConsolePath)
	for _, w := range []string{"/img/rootfs.ext4,serial=cube-slot-0", "disk-set cube-slot-1 /img/other.ext4", "snapshot " + snap + " incremental=false", "snapshot " + inc + " incremental=true"} {
		if !strings.Contains(string(log), w) {
			t.Errorf("fake vmm log %q lacks %q", log, w)
		}
	}
}

func TestProcessVMMKilledReportsSignal(t *testing.T) {
	v := newFakeProcessVMM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := v.Start(ctx, fakeVMMConfig(t, t.TempDir())); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(v.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-v.Wait()
	if e := v.Exit(); e.Status != 128+9 || e.Err == nil {
		t.Fatalf("exit %+v, want status 137", e)
	}
}

func TestProcessVMMStartErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v := newFakeProcessVMM(t)
	cfg := fakeVMMConfig(t, t.TempDir())
	cfg.Kernel = "crash"
	err := v.Start(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "status 3") {
		t.Fatalf("crashing vmm: err = %v", err)
	}
	missing := &ProcessVMM{Binary: "/nonexistent/cube-vmm"}
	if err := missing.Start(ctx, fakeVMMConfig(t, t.TempDir())); err == nil {
		t.Fatal("missing binary: want error")
	}
}

func TestCleanupKillsOnlyOurVMM(t *testing.T) {
	dir := t.TempDir()
	v := newFakeProcessVMM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := v.Start(ctx, fakeVMMConfig(t, dir)); err != nil {
		t.Fatal(err)
	}
	defer v.Stop(ctx)
	// A record naming another dir must not kill this VMM.
	other := t.TempDir()
	if err := Cleanup(Record{VMMPid: v.Pid(), Dir: other}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Wait():
		t.Fatal("cleanup killed a vmm that was not its own")
	default:
	}
	if err := Cleanup(Record{VMMPid: v.Pid(), Dir: dir}); err != nil {
		t.Fatal(err)
	}
	<-v.Wait()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dir still there: %v", err)
	}
}

// TestArgsParseWithTheRealVMM checks the command line against cube-vmm's own
// flag parser: every flag must be defined (a trailing -help then makes it
// return 0 without booting anything).
func TestArgsParseWithTheRealVMM(t *testing.T) {
	cfg := fakeVMMConfig(t, t.TempDir())
	var stderr strings.Builder
	if rc := vmmcmd.Run(append(Args(cfg), "-help"), strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm rejects the shim's flags (rc %d): %s", rc, stderr.String())
	}
	// A CRI pod's NIC: -net fd=3,mac=… (the tap itself is checked when the VM is made, after -help stops it).
	netCfg := cfg
	netCfg.Nets = []NIC{{Tap: os.Stdin, MAC: "02:42:0a:58:00:05"}}
	stderr.Reset()
	if rc := vmmcmd.Run(append(Args(netCfg), "-help"), strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm rejects the shim's -net flag (rc %d): %s", rc, stderr.String())
	}
	// -hugetlb.
	hugeCfg := cfg
	hugeCfg.HugeTLB = true
	stderr.Reset()
	if rc := vmmcmd.Run(append(Args(hugeCfg), "-help"), strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm rejects the shim's -hugetlb flag (rc %d): %s", rc, stderr.String())
	}
	// The virtio-fs share host directories go through: -fs tag=…,path=….
	shareCfg := cfg
	shareCfg.Shares = []Share{{Tag: ShareTag, Path: t.TempDir()}}
	stderr.Reset()
	if rc := vmmcmd.Run(append(Args(shareCfg), "-help"), strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm rejects the shim's -fs flag (rc %d): %s", rc, stderr.String())
	}
	// Template restore: "cube-vmm restore" must accept every flag (a -help before the directory stops it).
	cfg.Template = "/tpl"
	cfg.DiskPaths = map[string]string{"cube-slot-0": "/img/rootfs.ext4"}
	cfg.Shares = shareCfg.Shares // -fs-path
	cfg.DiskUses = map[string]string{"cube-slot-1": "/d/slot-1.img"}
	cfg.DiskSets = map[string]string{"cube-slot-0": "/img/rootfs.ext4"}
	args := Args(cfg)
	stderr.Reset()
	restoreArgs := append(append([]string{}, args[:len(args)-1]...), "-help")
	if rc := vmmcmd.Run(restoreArgs, strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm restore rejects the shim's flags (rc %d): %s", rc, stderr.String())
	}
	cfg.Nets, cfg.ReplaceNets = []NIC{{Tap: os.Stdin}}, true
	args = Args(cfg)
	stderr.Reset()
	restoreArgs = append(append([]string{}, args[:len(args)-1]...), "-help")
	if rc := vmmcmd.Run(restoreArgs, strings.NewReader(""), io.Discard, &stderr); rc != 0 {
		t.Fatalf("cube-vmm restore rejects the shim's -net flag (rc %d): %s", rc, stderr.String())
	}
}

type recordingTarget struct{ ops []string }

func (r *recordingTarget) SetDisk(serial, path string, _ bool) (*control.DiskSetResult, error) {
	if serial == "cube-slot-9" {
		return nil, fmt.Errorf("set disk %q: no such disk", serial)
	}
	r.ops = append(r.ops, "disk-set "+serial+" "+path)
	return &control.DiskSetResult{Serial: serial, Path: path}, nil
}

func (r *recordingTarget) Pause() error  { r.ops = append(r.ops, "pause"); return nil }
func (r *recordingTarget) Resume() error { r.ops = append(r.ops, "resume"); return nil }
func (r *recordingTarget) Stop()         {}
func (r *recordingTarget) InfoJSON() (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

// TestControlAgainstTheRealServer speaks to hypervisor/control's server, the
// one cube-vmm runs.
func TestControlAgainstTheRealServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	target := &recordingTarget{}
	srv, err := control.Listen(path, target)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	v := &ProcessVMM{cfg: VMConfig{ControlPath: path}}
	ctx := context.Background()
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Join(target.ops, ",") != "pause,resume" {
		t.Fatalf("ops %v", target.ops)
	}
	if err := v.SetDisk(ctx, "cube-slot-1", "/img/a.ext4", false); err != nil {
		t.Fatalf("disk-set: %v", err)
	}
	if got := target.ops[len(target.ops)-1]; got != "disk-set cube-slot-1 /img/a.ext4" {
		t.Fatalf("the server saw %q", got)
	}
	// The VMM's refusal reaches the caller with its reason.
	if err := v.SetDisk(ctx, "cube-slot-9", "/img/a.ext4", false); err == nil || !strings.Contains(err.Error(), "no such disk") {
		t.Fatalf("disk-set of an unknown serial: %v", err)
	}
}
