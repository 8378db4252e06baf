package kvmstats

import (
	"os"
	"path/filepath"
	"testing"
)

// Read sums a counter over VM directories and leaves out what it cannot
// read or parse.
func TestRead(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(a, "exits"), []byte("10\n"), 0o644)
	os.WriteFile(filepath.Join(b, "exits"), []byte("5\n"), 0o644)
	os.WriteFile(filepath.Join(a, "pf_taken"), []byte("7\n"), 0o644)
	os.WriteFile(filepath.Join(b, "pf_taken"), []byte("x\n"), 0o644)
	c := Read([]string{"exits", "pf_taken", "pf_fixed"}, a, b)
	if c["exits"] != 15 || c["pf_taken"] != 7 || len(c) != 2 {
		t.Fatalf("Read = %v, want exits 15, pf_taken 7 and nothing else", c)
	}
}

// parseHist names SVM exit codes and keeps unnamed ones as numbers.
func TestParseExitHist(t *testing.T) {
	h := "# event histogram\n#\n{ exit_reason:       1024 } hitcount:       5123\n{ exit_reason:        124 } hitcount:         17\n{ exit_reason:          4 } hitcount:          2\n\nTotals:\n    Hits: 5142\n"
	got := parseHist(h, "kvm_exit")
	if got["npf"] != 5123 || got["msr"] != 17 || got["0x4"] != 2 || len(got) != 3 {
		t.Fatalf("parseExitHist = %v", got)
	}
}

// parseHist names MSR accesses by their number.
func TestParseMSRHist(t *testing.T) {
	got := parseHist("{ ecx:       2096 } hitcount:        900\n", "kvm_msr")
	if got["msr 0x830"] != 900 || len(got) != 1 {
		t.Fatalf("parseHist = %v", got)
	}
}

// parseHist splits page faults by address: guest RAM below 1 GiB, the rest.
func TestParseNPFHist(t *testing.T) {
	h := "{ fault_address: ~ 2^28 } hitcount:       4000\n{ fault_address: ~ 2^20 } hitcount:       1000\n{ fault_address: ~ 2^32 } hitcount:        120\n"
	got := parseHist(h, "kvm_page_fault")
	if got["npf < 1 GiB"] != 5000 || got["npf ≥ 1 GiB"] != 120 || len(got) != 2 {
		t.Fatalf("parseHist = %v", got)
	}
}
