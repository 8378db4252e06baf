package vmmcmd

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/machine"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
)

var update = flag.Bool("update", false, "rewrite the golden snapshots (hypervisor/snapshot/testdata/v<snapshot.Version>) from a synthetic guest")

// TestGolden makes the golden snapshots' pair again, as cube-vmm writes
// snapshots (a counting guest with a disk, vsock and rng; a full snapshot,
// then an incremental one), and with -update commits it as the current
// version's golden. Without -update it fails if what cube-vmm writes now
// differs in shape from the golden (names, nesting, kinds of value): that
// is a format change, and a snapshot.Version bump.
func TestGolden(t *testing.T) {
	needKVM(t)
	full, diff := goldenPair(t, t.TempDir())
	if *update {
		if err := snapshottest.Update(snapshot.Version, full, diff); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", snapshottest.VersionDir(snapshot.Version))
		return
	}
	golden := snapshottest.Golden(t, snapshot.Version)
	for _, name := range []string{snapshottest.Full, snapshottest.Diff} {
		now := filepath.Join(filepath.Dir(full), name)
		for what, read := range map[string]func(string) []byte{"manifest": readManifest(t), "state": readPayload(t)} {
			want, err := snapshottest.Shape(read(filepath.Join(golden, name)))
			if err != nil {
				t.Fatal(err)
			}
			got, err := snapshottest.Shape(read(now))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("the %s snapshot's %s cube-vmm writes now differs from format version %d's golden:\n"+
					"only now:\n\t%s\nonly in the golden:\n\t%s\n"+
					"If the format changed, bump snapshot.Version (version.go says when) and run this test with -update.",
					name, what, snapshot.Version, joinLines(minus(got, want)), joinLines(minus(want, got)))
			}
		}
	}
}

// TestGoldenRestores restores the current version's golden incremental
// snapshot (both layers) in this process and runs it: the counter is the
// snapshot's, then counts on.
func TestGoldenRestores(t *testing.T) {
	needKVM(t)
	golden := snapshottest.Golden(t, snapshot.Version)
	diff := filepath.Join(golden, snapshottest.Diff)
	saved := goldenCounter(t, filepath.Join(golden, snapshottest.Full), diff)
	sock, err := os.MkdirTemp("", "gold") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sock)
	log := logrus.New()
	log.SetOutput(io.Discard)
	f := restoreFlags{console: "none", diskDir: t.TempDir(), vsock: filepath.Join(sock, "v.sock")}
	r, err := restoreVM(diff, f, nil, io.Discard, log)
	if err != nil {
		// Refused as an errno, or as MSRs KVM would not take all of
		// ("KVM_SET_MSRS wrote 12 of 40": an MSR the other CPU had).
		if !sameCPU(t, diff) {
			t.Skipf("this host's KVM refuses the golden's vCPU state, made on another CPU: %v", err)
		}
		t.Fatal(err)
	}
	defer r.close()
	if got, err := r.m.Memory().ReadUint64(counterAddr); err != nil || got != saved {
		t.Fatalf("restored counter %d (%v), the snapshot has %d", got, err, saved)
	}
	if err := r.m.StartRestored(false); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if got, _ := r.m.Memory().ReadUint64(counterAddr); got > saved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored guest does not count on from %d", saved)
		}
	}
}

// TestGoldenConfig: cube-vmm's configuration in the golden manifest decodes
// into Config and encodes to the same bytes.
func TestGoldenConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(snapshottest.VersionDir(snapshot.Version), snapshottest.Full, snapshot.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := snapshot.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(m.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	again, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := json.Compact(&want, m.Config); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, want.Bytes()) {
		t.Errorf("the golden's configuration re-encodes as\n%s\nit is\n%s\n(changing Config's json names is a snapshot.Version bump)", again, want.Bytes())
	}
	if len(cfg.Disks) != 1 || cfg.Vsock == "" || !cfg.RNG || cfg.MemoryMiB != 64 {
		t.Errorf("golden configuration %+v: want one disk, vsock, rng, 64 MiB", cfg)
	}
}

// goldenPair boots the counting guest the way cube-vmm does and writes the
// full and incremental snapshots into dir (named as in the golden).
func goldenPair(t *testing.T, dir string) (full, diff string) {
	t.Helper()
	disk := filepath.Join(dir, "root.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte("golden\n\x00"), 1024), 0o644); err != nil {
		t.Fatal(err)
	}
	vs, err := os.MkdirTemp("", "gold") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(vs) })
	cfg := defaults()
	cfg.Kernel, cfg.MemoryMiB, cfg.Console = kernel(t, counterCode), 64, "none"
	cfg.Disks = []Disk{{Path: disk, Serial: "root"}}
	cfg.Vsock = filepath.Join(vs, "v.sock")
	log := logrus.New()
	log.SetOutput(io.Discard)
	m, err := machine.New(machine.Config{KVMDevice: cfg.KVMDevice, Kernel: cfg.Kernel, Cmdline: cfg.Cmdline,
		MemoryMiB: cfg.MemoryMiB, VCPUs: cfg.VCPUs, HugePages: cfg.HugePages, Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	closeDevices, err := attachDevices(m, &cfg)
	defer closeDevices()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	target := newTarget(m, cfg, components(&cfg))
	full, diff = filepath.Join(dir, snapshottest.Full), filepath.Join(dir, snapshottest.Diff)
	for _, s := range []struct {
		dir         string
		incremental bool
	}{{full, false}, {diff, true}} {
		c, _ := m.Memory().ReadUint64(counterAddr)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if now, _ := m.Memory().ReadUint64(counterAddr); now > c+1000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the guest does not count")
			}
		}
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
		if _, err := target.Snapshot(s.dir, s.incremental); err != nil {
			t.Fatal(err)
		}
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	return full, diff
}

// goldenCounter is the counter the incremental snapshot diff holds (its
// page is in diff's own layer), checked to be past full's.
func goldenCounter(t *testing.T, full, diff string) uint64 {
	t.Helper()
	f, d := snapCounter(t, full), snapCounter(t, diff)
	if f == 0 || d <= f {
		t.Fatalf("golden counters: full %d, diff %d; want 0 < full < diff", f, d)
	}
	return d
}

// sameCPU reports whether the snapshot's vCPU 0 has this host's CPU vendor
// and family/model/stepping (CPUID leaves 0 and 1).
func sameCPU(t *testing.T, dir string) bool {
	t.Helper()
	s, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.DecodePayload(s.State)
	if err != nil || len(st.VCPUs) == 0 {
		t.Fatalf("golden state: %v", err)
	}
	sys, err := kvm.Open("/dev/kvm")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	host, err := sys.SupportedCPUID()
	if err != nil {
		t.Fatal(err)
	}
	type signature struct {
		vendor [3]uint32 // leaf 0: EBX, EDX, ECX
		model  uint32    // leaf 1: EAX
	}
	var h, g signature
	for _, e := range host {
		switch e.Function {
		case 0:
			h.vendor = [3]uint32{e.EBX, e.EDX, e.ECX}
		case 1:
			h.model = e.EAX
		}
	}
	for _, e := range st.VCPUs[0].CPUID {
		switch e.Function {
		case 0:
			g.vendor = [3]uint32{e.EBX, e.EDX, e.ECX}
		case 1:
			g.model = e.EAX
		}
	}
	return h == g
}

func readManifest(t *testing.T) func(string) []byte {
	return func(dir string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, snapshot.ManifestName))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func readPayload(t *testing.T) func(string) []byte {
	return func(dir string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, snapshot.StateName))
		if err != nil {
			t.Fatal(err)
		}
		p, err := snapshot.DecodeState(b)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for i, l := range s {
		if i > 0 {
			b.WriteString("\n\t")
		}
		b.WriteString(l)
	}
	return b.String()
}
