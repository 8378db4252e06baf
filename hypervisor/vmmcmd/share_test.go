package vmmcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestShareFlagAndConfig(t *testing.T) {
	dir := t.TempDir()
	cfg, err := parse([]string{"-kernel", "k", "-fs", "tag=a,path=" + dir, "-fs", "path=" + dir + ",tag=b,ro"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Share{{Tag: "a", Path: dir}, {Tag: "b", Path: dir, ReadOnly: true}}
	if !reflect.DeepEqual(cfg.FS, want) {
		t.Fatalf("FS = %+v, want %+v", cfg.FS, want)
	}
	if err := checkShares(cfg.FS); err != nil {
		t.Fatalf("checkShares: %v", err)
	}
	cfgPath := filepath.Join(dir, "vmm.toml")
	toml := "kernel = \"k\"\n[[fs]]\ntag = \"data\"\npath = \"" + dir + "\"\nread_only = true\n"
	if err := os.WriteFile(cfgPath, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = parse([]string{"-config", cfgPath}, &bytes.Buffer{})
	if err != nil || !reflect.DeepEqual(cfg.FS, []Share{{Tag: "data", Path: dir, ReadOnly: true}}) {
		t.Fatalf("config file: %+v, %v", cfg.FS, err)
	}
}

func TestShareRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"tag=a", "path=/x", "tag=a,path=/x,rw", ""} {
		if _, err := parse([]string{"-kernel", "k", "-fs", flag}, &bytes.Buffer{}); err == nil {
			t.Errorf("-fs %q accepted", flag)
		}
	}
	for name, shares := range map[string][]Share{
		"same tag":  {{Tag: "a", Path: dir}, {Tag: "a", Path: dir}},
		"long tag":  {{Tag: strings.Repeat("t", 37), Path: dir}},
		"relative":  {{Tag: "a", Path: "rel/dir"}},
		"missing":   {{Tag: "a", Path: filepath.Join(dir, "none")}},
		"not a dir": {{Tag: "a", Path: file}},
	} {
		if err := checkShares(shares); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
