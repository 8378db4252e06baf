package sandbox

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// consoleTailLines is how much of a failed sandbox's guest console the shim logs.
const consoleTailLines = 40

// logConsoleTail logs the last lines of the guest's console (console.log in the state dir), one log entry a
// line, with why: the state dir, and the console log with it, is removed when the sandbox goes, so a guest
// that panicked, reset or hung leaves its last words in the shim's log (containerd's) instead.
func (s *Sandbox) logConsoleTail(why string) {
	path := filepath.Join(s.o.Dir, "console.log")
	tail, err := ConsoleTail(path, consoleTailLines)
	if err != nil {
		s.o.Log.WithError(err).Warnf("sandbox %s: %s; no guest console to show", s.o.ID, why)
		return
	}
	if len(tail) == 0 {
		// A restored guest prints nothing until something happens: an empty console is evidence too.
		s.o.Log.Errorf("sandbox %s: %s; the guest console (%s) is empty", s.o.ID, why, path)
		return
	}
	s.o.Log.Errorf("sandbox %s: %s; guest console (last %d lines of %s):", s.o.ID, why, consoleTailLines, path)
	for _, l := range tail {
		s.o.Log.Errorf("sandbox %s console: %s", s.o.ID, l)
	}
}

// ConsoleTail returns the last n lines of the console log at path (at most its last 64 KiB), without
// carriage returns and empty trailing lines.
func ConsoleTail(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("guest console: %w", err)
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		if _, err := f.Seek(fi.Size()-window, io.SeekStart); err != nil {
			return nil, fmt.Errorf("guest console %s: %w", path, err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("guest console %s: %w", path, err)
	}
	b = bytes.ReplaceAll(b, []byte("\r"), nil)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil, nil
	}
	return lines[max(len(lines)-n, 0):], nil
}
