package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseCPUInfo(t *testing.T) {
	const info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC Processor\nflags\t\t: sse2 fpu svm\n\nprocessor\t: 1\nvendor_id\t: Other\n"
	h, err := parseCPUInfo(strings.NewReader(info))
	if err != nil || h.CPUVendor != "AuthenticAMD" || h.CPUModel != "AMD EPYC Processor" || strings.Join(h.CPUFlags, " ") != "fpu sse2 svm" {
		t.Fatalf("%+v %v", h, err)
	}
	if _, err := parseCPUInfo(strings.NewReader("processor: 0\n")); err == nil {
		t.Error("cpuinfo without vendor and flags accepted")
	}
	if err := h.CompatibleWith(h); err != nil {
		t.Errorf("a CPU is not compatible with itself: %v", err)
	}
	less := h
	less.CPUFlags = []string{"fpu"}
	if err := h.CompatibleWith(less); err == nil || !strings.Contains(err.Error(), "lacks: sse2 svm") {
		t.Errorf("a CPU without sse2 and svm: %v", err)
	}
}

func TestHostFactsFile(t *testing.T) {
	dir := t.TempDir()
	if h, err := ReadHostFacts(filepath.Join(dir, HostFactsName)); h != nil || err != nil {
		t.Errorf("no file: %v %v", h, err)
	}
	if _, err := CurrentHostFacts(); err != nil {
		t.Skipf("this host's /proc/cpuinfo: %v", err)
	}
	if err := WriteHostFacts(dir); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHostFacts(filepath.Join(dir, HostFactsName))
	if err != nil || h == nil || h.CPUVendor == "" {
		t.Fatalf("%v %v", h, err)
	}
	os.WriteFile(filepath.Join(dir, HostFactsName), []byte(strings.Repeat("x", maxHostFacts+1)), 0o600)
	if _, err := ReadHostFacts(filepath.Join(dir, HostFactsName)); err == nil {
		t.Error("an oversized file accepted")
	}
}

func FuzzParseCPUInfo(f *testing.F) {
	f.Add("vendor_id: x\nflags: a b\n")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseCPUInfo(strings.NewReader(s))
		if err == nil && (h.CPUVendor == "" || len(h.CPUFlags) == 0) {
			t.Fatal("accepted cpuinfo without vendor or flags")
		}
	})
}
