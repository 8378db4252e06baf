package guestimage

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// SharedLibs returns the absolute paths of the shared libraries (and the ELF interpreter) a host program needs,
// or nil for a static binary or a script. Symlinked names are returned as named, so the caller can recreate
// the same paths inside an image.
func SharedLibs(program string) ([]string, error) {
	f, err := elf.Open(program)
	if err != nil {
		return nil, nil // not ELF (a script): nothing to copy
	}
	dynamic := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			dynamic = true
		}
	}
	f.Close()
	if !dynamic {
		return nil, nil
	}
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	libs, err := parseLdd(out)
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	return libs, nil
}

// parseLdd reads ldd's output: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)",
// "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)".
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("missing library: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		f := strings.Fields(line)
		if len(f) > 0 && filepath.IsAbs(f[0]) {
			libs = append(libs, f[0])
		}
	}
	return libs, sc.Err()
}
