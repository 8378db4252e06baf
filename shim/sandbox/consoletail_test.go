package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConsoleTail(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "console.log")
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "line %d\r\n", i)
	}
	b.WriteString("\n\n")
	os.WriteFile(p, []byte(b.String()), 0o600)
	got, err := ConsoleTail(p, 3)
	if err != nil || strings.Join(got, "|") != "line 97|line 98|line 99" {
		t.Fatalf("ConsoleTail = %q, %v", got, err)
	}
	os.WriteFile(p, nil, 0o600)
	if got, err := ConsoleTail(p, 3); err != nil || len(got) != 0 {
		t.Errorf("empty console: %q, %v", got, err)
	}
	if _, err := ConsoleTail(filepath.Join(dir, "missing"), 3); err == nil {
		t.Error("a missing console log: no error")
	}
	// A long console: only its end is read.
	os.WriteFile(p, []byte(strings.Repeat("x", 200<<10)+"\nlast\n"), 0o600)
	if got, _ := ConsoleTail(p, 1); len(got) != 1 || got[0] != "last" {
		t.Errorf("long console: %q", got)
	}
}
