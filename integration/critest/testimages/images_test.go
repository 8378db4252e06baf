package testimages

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/pelletier/go-toml/v2"
)

// TestServe builds the images from this machine's static busybox, serves them, and reads some back over
// HTTP as containerd would (through the hosts.toml mapping: the registry name dropped).
func TestServe(t *testing.T) {
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		t.Skipf("no %s on this machine (Debian's busybox-static; .ci/install.d/containerd.sh installs it): %v", busybox, err)
	}
	imgs, err := Build(busybox, busybox) // any file stands for the web server here
	if err != nil {
		t.Fatal(err)
	}
	s, err := Serve("127.0.0.1:0", imgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	get := func(ref string) (string, string) {
		t.Helper()
		p, err := RepoPath(ref)
		if err != nil {
			t.Fatal(err)
		}
		r, err := name.ParseReference(s.Addr+"/"+p, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(r)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		d, _ := img.Digest()
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		return d.String(), cf.Config.User
	}
	t1, _ := get("gcr.io/k8s-staging-cri-tools/test-image-tags:1")
	t3, _ := get("gcr.io/k8s-staging-cri-tools/test-image-tags:3")
	i1, _ := get("gcr.io/k8s-staging-cri-tools/test-image-1:latest")
	i2, _ := get("gcr.io/k8s-staging-cri-tools/test-image-2:latest")
	if t1 != t3 || i1 == i2 {
		t.Errorf("test-image-tags:1 %s :3 %s (want the same); test-image-1 %s -2 %s (want different)", t1, t3, i1, i2)
	}
	p1, _ := get("registry.k8s.io/pause:3.9")
	p2, _ := get("k8s.gcr.io/pause:3.9")
	if p1 != p2 {
		t.Errorf("pause:3.9 differs between registries: %s %s", p1, p2)
	}
	if _, u := get("gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest"); u != "www-data:1004" {
		t.Errorf("USER %q, want www-data:1004", u)
	}
	get("registry.k8s.io/e2e-test-images/busybox:1.29-2")
	for _, bad := range []string{"busybox", "localhost/x"} {
		if _, err := RepoPath(bad); err == nil {
			t.Errorf("RepoPath(%q) accepted", bad)
		}
	}
}

func TestWriteHostsDir(t *testing.T) {
	dir := t.TempDir()
	if err := WriteHostsDir(dir, "127.0.0.1:5000"); err != nil {
		t.Fatal(err)
	}
	for _, r := range Registries {
		b, err := os.ReadFile(filepath.Join(dir, r, "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		var h struct {
			Server string
			Host   map[string]struct{ Capabilities []string }
		}
		if err := toml.Unmarshal(b, &h); err != nil {
			t.Fatalf("%s: %v\n%s", r, err, b)
		}
		if h.Server != "http://127.0.0.1:5000" || strings.Join(h.Host["http://127.0.0.1:5000"].Capabilities, ",") != "pull,resolve" {
			t.Errorf("%s: %+v", r, h)
		}
	}
	if err := WriteHostsDir(dir, "a\"b"); err == nil {
		t.Error("a quote in the address accepted")
	}
}
