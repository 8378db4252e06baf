package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseKeepsDefaultsForAbsentKeys(t *testing.T) {
	c, err := Parse([]byte("memory_mib = 512\nvcpus = 2\nkernel = \"/k\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.MemoryMiB, want.VCPUs, want.Kernel = 512, 2, "/k"
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	to, err := c.Durations()
	if err != nil {
		t.Fatal(err)
	}
	if to.Boot != 30*time.Second || to.Agent != 2*time.Minute {
		t.Fatalf("timeouts %+v", to)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"memroy_mib = 5", "memroy_mib"},
		{"memory_mib = 0", "memory_mib 0 out of range"},
		{"vcpus = 1000", "vcpus 1000 out of range"},
		{"disk_slots = 0", "disk_slots 0"},
		{"state_dir = \"rel\"", "not absolute"},
		{"boot_timeout = \"soon\"", "boot_timeout"},
		{"boot_timeout = \"-1s\"", "must be positive"},
		{"agent_timeout = \"0s\"", "agent_timeout \"0s\" must be positive"},
		{"agent_timeout = \"2\"", "agent_timeout"},
		{"vmm = \"\"", "vmm is empty"},
		{"hugetlb = true\nmemory_mib = 255", "memory_mib 255 with hugetlb: must be even"},
		{"memory_mib = \"x\"", "parse shim config"},
		{"= broken", "parse shim config"},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shim.toml")
	if err := os.WriteFile(p, []byte("vcpus = 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.VCPUs != 4 || c.MemoryMiB != DefaultMemoryMiB {
		t.Fatalf("got %+v", c)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); err == nil {
		t.Fatal("explicit missing file: want error")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("memory_mib = 512\nvcpus = 2\n"))
	f.Add([]byte("boot_timeout = \"1s\"\nstate_dir = \"/x\"\n"))
	f.Add([]byte("[x]\ny = 1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("Parse accepted a config Validate rejects: %v", verr)
			}
		}
	})
}

// The shipped example (contrib/containerd/shim.toml) lists every key with its
// default: it must parse and equal Default(), so docs and code stay in step.
func TestContribExampleIsTheDefaults(t *testing.T) {
	data, err := os.ReadFile("../../contrib/containerd/shim.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if c != Default() {
		t.Fatalf("contrib shim.toml = %+v\ndefaults          = %+v", c, Default())
	}
}
