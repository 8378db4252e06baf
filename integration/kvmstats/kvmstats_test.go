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
	h := "# event histogram\n#\n{ guest_rip:           401000 } hitcount:          9\n{ exit_reason:       1024 } hitcount:       5123\n{ exit_reason:        124 } hitcount:         17\n{ exit_reason:          4 } hitcount:          2\n\nTotals:\n    Hits: 5142\n"
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

// parseRIPHists files each sample under the trigger whose section it is in.
func TestParseRIPHists(t *testing.T) {
	h := `# event histogram
#
# trigger info: hist:keys=guest_rip.hex:vals=hitcount:sort=hitcount:size=8192 if exit_reason == 96 [active]
#

{ guest_rip: ffffffff81c3a1b2 } hitcount:         12
{ guest_rip:           4a7b10 } hitcount:          3

Totals:
    Hits: 15

# event histogram
#
# trigger info: hist:keys=guest_rip.hex:vals=hitcount:sort=hitcount:size=16384 if exit_reason == 1024 [active]
#

{ guest_rip: ffffffff81234567 } hitcount:        700
`
	intr, npf, err := parseRIPHists(h)
	if err != nil || intr[0xffffffff81c3a1b2] != 12 || intr[0x4a7b10] != 3 || len(intr) != 2 || npf[0xffffffff81234567] != 700 || len(npf) != 1 {
		t.Fatalf("parseRIPHists = %v, %v, %v", intr, npf, err)
	}
}
