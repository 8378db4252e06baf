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
