package cubetest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/sandboxenv"
)

// Paths inside the test host.
const (
	CubeVMM     = sandboxenv.CubeVMM
	GuestKernel = sandboxenv.GuestKernel
	GuestInitrd = sandboxenv.GuestInitrd
	RootfsImage = sandboxenv.RootfsImage
	// For the containerd test: containerd 2.4.2 and ctr from the machine,
	// our shim and snapshotter (and the cube CLI: cubeBin), and a busybox OCI
	// image tar.
	ContainerdBin  = "/cube/bin/containerd"
	CtrBin         = "/cube/bin/ctr"
	ShimBin        = "/cube/bin/containerd-shim-cube-v1"
	SnapshotterBin = "/cube/bin/cube-snapshotter"
	ImageTar       = "/cube/image.tar"
	ImageRef       = "docker.io/cube/e2e:latest"
)

// WriteImageTar writes the busybox OCI image tar that TestCtrRun imports.
func WriteImageTar(env *sandboxenv.Env) error {
	img, err := OCIImageTar("/bin/busybox", ImageRef, []string{"sh", "echo", "cat", "sleep", "hostname", "true"})
	if err != nil {
		return fmt.Errorf("image tar: %w", err)
	}
	p := filepath.Join(env.Dir, "image.tar")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		return err
	}
	env.Files[ImageTar] = p
	return nil
}

func FileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Paths inside the test host for the CRI test.
const (
	CrictlBin = "/cube/bin/crictl"
	// CritestBin is cri-tools' CRI validation suite (integration/critest), at crictl's version.
	CritestBin = "/cube/bin/critest"
	// CRIContribConfig is contrib/containerd/cube-runtime.toml, imported
	// as it is by the test's containerd config: what users install is what
	// is tested (proxy snapshotter socket, CRI handler "cube").
	CRIContribConfig = "/cube/contrib/cube-runtime.toml"
	// The contrib config's snapshotter socket (cube-snapshotter's default).
	CRISnapshotterSock = "/run/cube-snapshotter/snapshotter.sock"
	PauseImageRef      = "docker.io/cube/pause:latest"
)

// The CRI pod's network: Debian's containernetworking-plugins (bridge +
// host-local + loopback, and portmap for host ports) copied into the test
// host when the machine has them.
const CNIBinDir = "/cube/cni/bin"

var CNIPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// IptablesBin is iptables in the test host (the machine's, iptables-nft, with
// its extensions): CNI's portmap plugin runs it to map host ports. It is
// copied in when the machine has it (a dependency of Debian's
// containernetworking-plugins).
const IptablesBin = "/usr/sbin/iptables"

func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func FirstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// CountingServer is an HTTP server in the test host that counts the
// requests it got.
type CountingServer struct {
	URL  string
	Hits atomic.Int64
}

func NewCountingServer(t *testing.T, ip string) *CountingServer {
	t.Helper()
	l, err := net.Listen("tcp4", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", ip, err)
	}
	s := &CountingServer{URL: fmt.Sprintf("http://%s/", l.Addr())}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Hits.Add(1)
		fmt.Fprintf(w, "hello-from %s\n", ip)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return s
}
