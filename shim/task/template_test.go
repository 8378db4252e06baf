package task

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/config"
	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/template"
)

// TestTemplateForNICs: a sandbox's TemplateFor asks the cache for the
// shape with its NIC count (another key per count) and reads the NICs'
// MACs from the template snapshot's manifest; a template whose VM has no
// NIC gives none.
func TestTemplateForNICs(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	self, _ := os.Executable()
	cfg := config.Config{Templates: true, TemplateDir: filepath.Join(dir, "templates"), VMM: self, Kernel: kernel,
		Cmdline: "console=hvc0", MemoryMiB: 256, VCPUs: 1, DiskSlots: 2}
	cache := &template.Cache{Root: cfg.TemplateDir}
	// Templates already made: one per NIC count (a build here would boot a VM).
	for nics, netCfg := range map[int]string{0: `{"Kernel":"/k"}`, 1: `{"Kernel":"/k","Net":[{"None":true,"MAC":"02:cb:00:00:00:01"}]}`} {
		shape := ShapeOf(cfg)
		shape.NICs = nics
		key, _, err := cache.Key(shape)
		if err != nil {
			t.Fatal(err)
		}
		m := testManifest("")
		m.Config = json.RawMessage(netCfg)
		b, _ := json.Marshal(m)
		vm := cache.Dir(key)
		if err := os.MkdirAll(vm, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(vm, "manifest.json"), b, 0o600)
	}
	get := templateFor(cfg, config.Timeouts{TemplateWait: time.Second, Boot: time.Second, Agent: time.Second}, logrus.NewEntry(logrus.StandardLogger()))
	t0, err := get(context.Background(), 0)
	if err != nil || len(t0.NICMACs) != 0 {
		t.Fatalf("template without NICs: %+v %v", t0, err)
	}
	t1, err := get(context.Background(), 1)
	if err != nil || len(t1.NICMACs) != 1 || t1.NICMACs[0] != sandbox.TemplateNICMAC(0) || t1.Dir == t0.Dir {
		t.Fatalf("template with a NIC: %+v %v (without: %s)", t1, err, t0.Dir)
	}
}

// TestTemplateNetwork: a template VM's network gives NICs without a
// backend, with the recipe's MACs, and nothing for the guest to configure.
func TestTemplateNetwork(t *testing.T) {
	a, err := templateNetwork(2).Attach(context.Background())
	if err != nil || len(a.NICs) != 2 || len(a.Guest.Interfaces) != 0 || a.Guest.DNS != nil {
		t.Fatalf("attachment %+v %v", a, err)
	}
	for i, n := range a.NICs {
		if !n.NoBackend || n.Tap != nil || n.MAC != sandbox.TemplateNICMAC(i) {
			t.Errorf("nic %d: %+v", i, n)
		}
	}
	if sandbox.TemplateNICMAC(0) == sandbox.TemplateNICMAC(1) {
		t.Error("two NICs with one MAC")
	}
}
