// Package testimages builds, from one static busybox, the container images critest v1.37.0 pulls (under the
// names it pulls them by: registry.k8s.io, gcr.io/k8s-staging-cri-tools, k8s.gcr.io), serves them from an
// in-memory registry (go-containerregistry's pkg/registry) and writes containerd's registry host
// configuration (hosts.toml per registry name) that sends those names to it. No internet: the test host
// has none. cmd/cube-testregistry wires it; integration/critest runs it in the test host.
package testimages

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PauseImage is the pause image critest pulls; TestCritest's containerd uses it as the sandbox image.
const PauseImage = "registry.k8s.io/pause:3.9"

// Registries are the registry names critest's images live under; each gets a hosts.toml.
var Registries = []string{"registry.k8s.io", "gcr.io", "k8s.gcr.io"}

const (
	e2e     = "registry.k8s.io/e2e-test-images/"
	staging = "gcr.io/k8s-staging-cri-tools/"
)

// NotBuilt are images critest uses that this package does not make, and why (their specs belong in the skip
// list).
var NotBuilt = map[string]string{
	staging + "test-image-digest@sha256:9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf": "pulled by a digest of the upstream build: a locally built image cannot have it",
	e2e + "nonewprivs:1.3": "needs a setuid-root test program reporting its effective uid; not rebuilt here",
}

// busybox's /etc/passwd and /etc/group, as in the busybox image the upstream test images derive from.
const (
	passwd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`
	group = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
www-data:x:33:
operator:x:37:
staff:x:50:
users:x:100:
nogroup:x:65534:
`
)

// Applets critest runs that Debian's busybox-static lacks, as scripts over what it has.
const (
	// pgrep PATTERN: the pids of processes whose name matches.
	pgrep = `#!/bin/sh
found=1
for d in /proc/[0-9]*; do
	read -r n < "$d/comm" 2>/dev/null || continue
	if echo "$n" | grep -q -- "$1"; then echo "${d#/proc/}"; found=0; fi
done
exit $found
`
	// ipcs -m: the System V shared memory segments, in ipcs' columns.
	ipcs = `#!/bin/sh
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch     status"
tail -n +2 /proc/sysvipc/shm 2>/dev/null | while read -r key shmid perms size cpid lpid nattch uid rest; do
	printf '0x%08x %-10s %-10s %-10s %-10s %-10s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
`
)

// Image is one image under each of its references (same digest for all).
type Image struct {
	Refs []string
	Img  v1.Image
}

// file is one regular file, symlink (link) or hard link (hard) of a layer.
type file struct {
	name, link, hard string
	mode             int64
	body             []byte
}

var epoch = time.Unix(0, 0)

// layer is an uncompressed OCI layer with dirs and files (deterministic: same input, same digest).
func layer(dirs []string, files []file) (v1.Layer, error) {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := w.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(f.body)), ModTime: epoch}
		switch {
		case f.link != "":
			h = &tar.Header{Name: f.name, Typeflag: tar.TypeSymlink, Linkname: f.link, Mode: 0o777, ModTime: epoch}
		case f.hard != "":
			h = &tar.Header{Name: f.name, Typeflag: tar.TypeLink, Linkname: f.hard, Mode: 0o755, ModTime: epoch}
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := w.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return static.NewLayer(b.Bytes(), types.OCIUncompressedLayer), nil
}

// image is base plus layers with cfg (Cmd, User, Env…) for linux/amd64.
func image(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: epoch}
	if len(cfg.Env) == 0 {
		cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// busyboxLayer is the busybox image's root: the binary, a hard link per applet (from `busybox --list`; hard,
// as in the busybox image: critest's MaskedPaths masks /bin/ls, and a bind mount over a symlink would mask
// busybox itself), the password and group files.
func busyboxLayer(busybox string) (v1.Layer, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("read busybox: %w", err)
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	files := []file{{name: "bin/busybox", mode: 0o755, body: bb},
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd)}, {name: "etc/group", mode: 0o644, body: []byte(group)},
		{name: "bin/pgrep", mode: 0o755, body: []byte(pgrep)}, {name: "bin/ipcs", mode: 0o755, body: []byte(ipcs)}}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && a != "pgrep" && a != "ipcs" {
			files = append(files, file{name: "bin/" + a, hard: "bin/busybox"})
		}
	}
	return layer([]string{"bin", "dev", "etc", "home", "proc", "root", "sys", "tmp", "usr", "usr/sbin", "var", "var/run", "var/www"}, files)
}

// Build makes every image critest pulls (but NotBuilt) from the static busybox binary at busybox; the web
// server images run the static program at webServer (cube-testregistry itself: WebServer).
func Build(busybox, webServer string) ([]Image, error) {
	base, err := busyboxLayer(busybox)
	if err != nil {
		return nil, err
	}
	ws, err := os.ReadFile(webServer)
	if err != nil {
		return nil, fmt.Errorf("read the web server: %w", err)
	}
	webLayer, err := layer(nil, []file{{name: nginxBin, mode: 0o755, body: ws}, {name: httpdBin, link: "nginx"},
		{name: pauseBin, link: nginxBin}})
	if err != nil {
		return nil, err
	}
	var imgs []Image
	// The images running cube-testregistry's stand-ins (web servers, pause) have its layer.
	add := func(cfg v1.Config, extra []file, refs ...string) error {
		layers := []v1.Layer{base}
		if len(cfg.Cmd)+len(cfg.Entrypoint) > 0 && IsStandIn(append(cfg.Entrypoint, cfg.Cmd...)[0]) {
			layers = append(layers, webLayer)
		}
		if len(extra) > 0 {
			l, err := layer(nil, extra)
			if err != nil {
				return err
			}
			layers = append(layers, l)
		}
		img, err := image(cfg, layers...)
		if err != nil {
			return fmt.Errorf("image %s: %w", refs[0], err)
		}
		imgs = append(imgs, Image{Refs: refs, Img: img})
		return nil
	}
	sh := v1.Config{Cmd: []string{"sh"}}
	web := func(name, port string) []string {
		return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "WEB_NAME=" + name, "WEB_PORT=" + port}
	}
	// upstream's image-test: busybox plus an empty file named after the image (ADD ${TEST}).
	marker := func(n string) []file { return []file{{name: n, mode: 0o644}} }
	steps := []error{
		add(sh, nil, e2e+"busybox:1.29-2"),
		add(v1.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, Env: web("nginx", "80")}, nil, e2e+"nginx:1.14-2"),
		add(v1.Config{Cmd: []string{"httpd-foreground"}, Env: web("httpd", "80")}, nil, e2e+"httpd:2.4.39-4"),
		// images/hostnet-nginx: nginx on port 12003 (webServerHostNetContainerPort).
		add(v1.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, Env: web("nginx", "12003")}, nil, staging+"hostnet-nginx-amd64:latest"),
		// The pods' sandbox image too (TestCritest pins it): its process is named pause, as critest expects of
		// pid 1 in a pod's shared pid namespace.
		add(v1.Config{Entrypoint: []string{"/pause"}}, nil, PauseImage, "k8s.gcr.io/pause:3.9"),
		add(sh, marker("test-image-latest"), staging+"test-image-latest:latest"),
		add(sh, marker("test-image-tag"), staging+"test-image-tag:test", staging+"test-image-tag:all"),
		add(sh, marker("same-image"), staging+"test-image-tags:1", staging+"test-image-tags:2", staging+"test-image-tags:3"),
	}
	for _, n := range []string{"test-image-1", "test-image-2", "test-image-3"} {
		steps = append(steps, add(sh, marker(n), staging+n+":latest"))
	}
	// images/image-user: busybox with USER.
	users := map[string]string{"test-image-user-uid": "1002", "test-image-user-username": "www-data",
		"test-image-user-uid-group": "1003:1004", "test-image-user-username-group": "www-data:1004"}
	for n, u := range users {
		steps = append(steps, add(v1.Config{Cmd: []string{"sh"}, User: u}, nil, staging+n+":latest"))
	}
	// images/image-predefined-group: user 1000 in a group 50000 of the image's /etc/group.
	steps = append(steps, add(v1.Config{Cmd: []string{"sh"}, User: "1000"}, []file{
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, body: []byte(group + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")},
	}, staging+"test-image-predefined-group:latest"))
	for _, err := range steps {
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Refs[0] < imgs[j].Refs[0] })
	return imgs, nil
}

// RepoPath is a reference's repository and tag without the registry name, as served by the one registry
// standing in for all of Registries ("registry.k8s.io/pause:3.9" → "pause:3.9").
func RepoPath(ref string) (string, error) {
	host, rest, ok := strings.Cut(ref, "/")
	if !ok || !strings.Contains(host, ".") || rest == "" {
		return "", fmt.Errorf("%q: not a registry-qualified reference", ref)
	}
	return path.Clean(rest), nil
}
