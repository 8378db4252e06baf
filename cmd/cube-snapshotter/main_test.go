package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommandLine(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"--help"}, {"help"}, {"default-config"}, {"probe", dir}} {
		if err := run(args); err != nil {
			t.Errorf("run %q: %v", args, err)
		}
	}
	cfg := filepath.Join(dir, "c.toml")
	os.WriteFile(cfg, []byte("root = \""+dir+"\"\n"), 0o600)
	for args, want := range map[string]string{
		"bogus":                          "unknown command",
		"probe":                          "want one directory",
		"--no-such-flag":                 "flag provided but not defined",
		"status --root " + dir:           "is cube-snapshotter running",
		"status --config " + cfg:         "is cube-snapshotter running",
		"--config " + dir + "/missing":   "no such file",
		"--log-level loud --root " + dir: "log level",
		"--root " + dir + " extra":       "unexpected arguments",
	} {
		err := run(strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run %q: %v, want error containing %q", args, err, want)
		}
	}
}
