package cubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// ReadStat parses a comm with spaces and parentheses, and the process's own
// stat file.
func TestReadStat(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stat")
	os.WriteFile(p, []byte("42 (a (b) c) R 7 1 1 0 -1 4194560 1 0 0 0 11 22 33 44 20 0 1 0 5 0 0\n"), 0o644)
	st, ok := ReadStat(p)
	if !ok || st.Comm != "a (b) c" || st.State != "R" || st.PPID != "7" || st.UTime != 11 || st.STime != 22 ||
		st.CUTime != 33 || st.CSTime != 44 {
		t.Fatalf("ReadStat = %+v, %v", st, ok)
	}
	if st, ok := ReadStat(fmt.Sprintf("/proc/%d/stat", os.Getpid())); !ok || st.PPID != fmt.Sprint(os.Getppid()) {
		t.Fatalf("own stat: %+v, %v", st, ok)
	}
	if _, ok := ReadStat(filepath.Join(t.TempDir(), "none")); ok {
		t.Fatal("a missing file parsed")
	}
}
