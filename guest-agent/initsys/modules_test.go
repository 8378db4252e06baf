package initsys

import (
	"os"
	"path/filepath"
	"testing"
)

// TestModulesOrderMatchesKernelPackage checks Modules against the real
// kernel package: every file exists and every dependency comes first.
// CUBE_GUEST_MODULES names an extracted /lib/modules/<release> directory of
// the pinned linux-image-cloud-amd64 package.
func TestModulesOrderMatchesKernelPackage(t *testing.T) {
	dir := os.Getenv("CUBE_GUEST_MODULES")
	if dir == "" {
		t.Skip("CUBE_GUEST_MODULES (extracted lib/modules/<release> of the guest kernel package) not set")
	}
	seen := map[string]bool{}
	for _, m := range Modules {
		ko, err := os.ReadFile(filepath.Join(dir, m.Path))
		if err != nil {
			t.Fatalf("module %s: %v", m.Name, err)
		}
		info, err := ModInfo(ko)
		if err != nil {
			t.Fatalf("module %s: %v", m.Name, err)
		}
		if got := info["name"]; len(got) != 1 || got[0] != m.Name {
			t.Errorf("module file %s has name %v, want %s", m.Path, got, m.Name)
		}
		deps, err := ModuleDepends(ko)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deps {
			if !seen[d] {
				t.Errorf("module %s depends on %s, which is not loaded before it", m.Name, d)
			}
		}
		seen[m.Name] = true
	}
}

func TestModInfoRejectsGarbage(t *testing.T) {
	for _, in := range [][]byte{nil, []byte("not an elf"), []byte("\x7fELF\x02\x01\x01")} {
		if _, err := ModInfo(in); err == nil {
			t.Errorf("ModInfo(%q) succeeded", in)
		}
	}
}

func TestModInfoOfOwnBinary(t *testing.T) {
	// Our test binary is ELF without .modinfo: a precise error, no panic.
	exe, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ModInfo(exe); err == nil || err.Error() != "modinfo: no .modinfo section" {
		t.Fatalf("ModInfo(test binary) = %v, want no .modinfo section", err)
	}
}

func FuzzModInfo(f *testing.F) {
	f.Add([]byte("\x7fELF"))
	if dir := os.Getenv("CUBE_GUEST_MODULES"); dir != "" {
		if ko, err := os.ReadFile(filepath.Join(dir, Modules[0].Path)); err == nil {
			f.Add(ko)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ModuleDepends(data) // must not panic
	})
}

func TestModuleLoaderSkipsPresentModules(t *testing.T) {
	sys := t.TempDir()
	if err := os.Mkdir(filepath.Join(sys, "virtio_ring"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := &ModuleLoader{Dir: t.TempDir(), SysModule: sys}
	loaded, err := l.Load([]Module{{"virtio_ring", "x.ko"}, {"virtio", "missing.ko"}})
	if len(loaded) != 0 || err == nil {
		t.Fatalf("Load = %v, %v; want nothing loaded and an error for the missing file", loaded, err)
	}
	if want := "load module virtio"; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("error %q does not name the module", err)
	}
}
