package sandboxnet

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/libcni"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts(" 8080:80, 5353:53/udp,9000:9000/tcp ")
	if err != nil {
		t.Fatal(err)
	}
	want := []PortMapping{{8080, 80, "tcp"}, {5353, 53, "udp"}, {9000, 9000, "tcp"}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("port %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if s := FormatPorts(got); s != "8080:80/tcp,5353:53/udp,9000:9000/tcp" {
		t.Errorf("FormatPorts: %q", s)
	}
	if p, err := ParsePorts(""); err != nil || p != nil {
		t.Errorf("empty: %v %v", p, err)
	}
	for _, bad := range []string{"80", "0:80", "80:70000", "a:80", "80:80/sctp", "80:80,80:81", "-1:80", "80:"} {
		if _, err := ParsePorts(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want InvalidArgument", bad, err)
		}
	}
	// The same host port on tcp and udp is two mappings.
	if _, err := ParsePorts("53:53/tcp,53:53/udp"); err != nil {
		t.Errorf("tcp and udp on one port: %v", err)
	}
}

func TestReadState(t *testing.T) {
	st, err := ReadState(strings.NewReader(`{"ociVersion":"1.2.0","id":"sb1","status":"creating","pid":42,"bundle":"/b","annotations":{"` + AnnotationPorts + `":"8080:80"}}`))
	if err != nil || st.ID != "sb1" || st.Pid != 42 || st.Annotations[AnnotationPorts] != "8080:80" {
		t.Fatalf("%+v %v", st, err)
	}
	for name, in := range map[string]string{"not JSON": "{", "no id": `{"pid":1}`, "too large": `{"id":"` + strings.Repeat("a", maxState) + `"}`} {
		if _, err := ReadState(strings.NewReader(in)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestEnsureConflistAndCheck(t *testing.T) {
	dir := t.TempDir()
	c := Config{Network: DefaultNetwork, ConfDir: filepath.Join(dir, "conf"), BinDirs: []string{filepath.Join(dir, "bin")}, CacheDir: filepath.Join(dir, "cache")}
	if err := EnsureConflist(c); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(c.ConfDir, "cube.conflist"))
	if err != nil {
		t.Fatalf("the default list does not load: %v", err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if list.Name != "cube" || strings.Join(types, ",") != "bridge,portmap" {
		t.Errorf("default list %s: %v", list.Name, types)
	}
	var raw struct {
		Plugins []struct {
			IPAM struct {
				DataDir string `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	b, _ := os.ReadFile(filepath.Join(c.ConfDir, "cube.conflist"))
	if err := json.Unmarshal(b, &raw); err != nil || raw.Plugins[0].IPAM.DataDir != filepath.Join(c.CacheDir, "ipam") {
		t.Errorf("host-local's leases not under the cache dir: %+v %v", raw, err)
	}
	// A user's file is kept.
	os.WriteFile(filepath.Join(c.ConfDir, "cube.conflist"), []byte("mine"), 0o644)
	if err := EnsureConflist(c); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(c.ConfDir, "cube.conflist")); string(b) != "mine" {
		t.Errorf("the user's list was replaced: %q", b)
	}
	os.WriteFile(filepath.Join(c.ConfDir, "cube.conflist"), DefaultConflist(c), 0o644)
	// Check names the missing plugin and how to get it.
	if err := Check(c); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"bridge"`) || !strings.Contains(err.Error(), "containernetworking-plugins") {
		t.Errorf("no plugins: %v", err)
	}
	os.MkdirAll(c.BinDirs[0], 0o755)
	for _, p := range []string{"bridge", "portmap"} {
		os.WriteFile(filepath.Join(c.BinDirs[0], p), []byte("#!/bin/sh\n"), 0o755)
	}
	if err := Check(c); err != nil {
		t.Errorf("plugins present: %v", err)
	}
	// Another network's list must exist.
	other := c
	other.Network = "corp"
	if err := EnsureConflist(other); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "corp.conflist") {
		t.Errorf("missing list of another network: %v", err)
	}
}

func TestArgs(t *testing.T) {
	c := Config{Network: "n", ConfDir: "/c", BinDirs: []string{"/a", "/b"}, CacheDir: "/k"}
	if got := strings.Join(c.Args(), " "); got != "--network n --cni-conf-dir /c --cni-bin-dir /a:/b --cni-cache-dir /k" {
		t.Errorf("Args: %s", got)
	}
}

// TestAddRefusals: what Add refuses before it runs a plugin.
func TestAddRefusals(t *testing.T) {
	dir := t.TempDir()
	c := Config{Network: DefaultNetwork, ConfDir: dir, BinDirs: []string{dir}, CacheDir: dir}
	if err := EnsureConflist(c); err != nil {
		t.Fatal(err)
	}
	if _, err := Add(context.Background(), c, specs.State{ID: "x"}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "createRuntime") {
		t.Errorf("no pid: %v", err)
	}
	st := specs.State{ID: "x", Pid: 1, Annotations: map[string]string{AnnotationPorts: "80"}}
	if _, err := Add(context.Background(), c, st); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), AnnotationPorts) {
		t.Errorf("bad ports: %v", err)
	}
	if _, err := Address(c, "never-added"); err == nil {
		t.Errorf("an address for a sandbox never added")
	}
}
