package cubetest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/sandboxenv"
	"github.com/cube-runtime/cube/integration/testhost"
)

// Setup is what one e2e package adds to the common test host of Main.
type Setup struct {
	// Name appears in the temporary directory and the -short message (e.g. "shim").
	Name string
	// Bins are further Go programs to build into the test host: path there → package.
	Bins map[string]string
	// Programs are further programs of this machine (names on PATH) copied into the test host when found:
	// path there → name (a test needing one says so when it is missing).
	Programs map[string]string
	// Env is passed to the tests inside the test host.
	Env []string
	// Forwards are ports of this machine's 127.0.0.1 forwarded into the test host (testhost.Options).
	Forwards []testhost.Forward
	// Timeout bounds one test-host run of the package (testhost.Options.Timeout); 0 means 25 minutes.
	Timeout time.Duration
}

// Main is an e2e package's TestMain: inside the test host it runs the tests; outside it builds the shim, the
// snapshotter, the cube CLI and s.Bins, writes the busybox image tar, copies containerd, ctr, crictl, runc and
// the CNI plugins from the machine, boots one test host for the package and exits with the tests' status.
func Main(m *testing.M, s Setup) {
	if testhost.Inside() {
		os.Exit(m.Run())
	}
	// Decide before building anything: -short leaves the test host out.
	flag.Parse()
	if testing.Short() {
		fmt.Printf("SKIP: the %s end-to-end tests run in the QEMU test host, which -short leaves out (run `make e2e`)\n", s.Name)
		os.Exit(0)
	}
	env, err := prepare(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: prepare guest artifacts: %v\n", err)
		if env != nil {
			env.Close()
		}
		os.Exit(1)
	}
	timeout := s.Timeout
	switch {
	case timeout != 0:
	case benchmarking():
		// A benchmark run (-bench, opt-in, never in make test) fills the test host: BenchmarkCtrDensity starts
		// 60 and more sandboxes one after another in a 1-vCPU test host.
		timeout = 50 * time.Minute
	default:
		timeout = 25 * time.Minute
	}
	code := testhost.RunMain(m, testhost.Options{
		Env:     s.Env,
		Timeout: timeout,
		Files:   env.Files,
		// The snapshotter makes ext4 images; containerd's diff applier
		// loop-mounts them to unpack layers. containerd's CRI CheckpointContainer refuses to run without a
		// criu binary of a minimum version, even for a runtime that does not use it (TestCRICheckpointPodVM).
		Tools: []string{"mkfs.ext4", "debugfs", "criu"},
		// CRI pod networking: veth + bridge (CNI's bridge plugin), the VM's tap and the tc redirects; egress
		// policies; host ports (CNI's portmap through iptables-nft: an ip nat table, `-m addrtype` as a fib
		// expression, DNAT, masquerade; nft_compat and the xt modules for what iptables does not translate).
		Modules: []string{"loop", "overlay", "tun", "veth", "bridge", "sch_ingress", "cls_u32", "act_mirred", "nf_tables",
			"nft_chain_nat", "nft_nat", "nft_masq", "nft_fib_ipv4", "nft_compat", "xt_nat", "xt_MASQUERADE", "xt_addrtype",
			"xt_comment", "xt_multiport", "xt_tcpudp", "xt_mark"},
		Forwards: s.Forwards,
	})
	env.Close() // not deferred: os.Exit skips deferred calls
	os.Exit(code)
}

// benchmarking reports whether this run was asked for benchmarks (-test.bench set).
func benchmarking() bool {
	f := flag.Lookup("test.bench")
	return f != nil && f.Value.String() != ""
}

// prepare builds and gathers the test host's files.
func prepare(s Setup) (*sandboxenv.Env, error) {
	bins := map[string]string{
		ShimBin:        "github.com/cube-runtime/cube/cmd/containerd-shim-cube-v1",
		SnapshotterBin: "github.com/cube-runtime/cube/cmd/cube-snapshotter",
		CubeBin:        "github.com/cube-runtime/cube/cmd/cube",
	}
	for dst, pkg := range s.Bins {
		bins[dst] = pkg
	}
	env, err := sandboxenv.Prepare("cube-"+s.Name+"-e2e-", bins)
	if err != nil {
		return env, err
	}
	if err := WriteImageTar(env); err != nil {
		return env, err
	}
	// The CRI tests' containerd imports the contrib snippet as shipped (go test runs in the package's
	// directory, integration/<name>).
	if env.Files[CRIContribConfig], err = filepath.Abs("../../contrib/containerd/cube-runtime.toml"); err != nil {
		return env, err
	}
	// containerd and ctr come from the machine (.ci/install.d/containerd.sh);
	// without them the containerd tests skip inside the test host and say so.
	for dst, name := range map[string]string{ContainerdBin: "containerd", CtrBin: "ctr", CrictlBin: "crictl",
		"/cube/bin/containerd-shim-runc-v2": "containerd-shim-runc-v2", "/cube/bin/runc": "runc"} {
		if p, err := exec.LookPath(name); err == nil {
			env.Files[dst] = p
		}
	}
	for dst, name := range s.Programs {
		if p, err := exec.LookPath(name); err == nil {
			env.Files[dst] = p
		}
	}
	// CNI plugins for pod networks (Debian's containernetworking-plugins, installed by
	// .ci/install.d/containerd.sh); without them the CRI test's pod is host-network and says so.
	for _, name := range CNIPlugins {
		if p := filepath.Join("/usr/lib/cni", name); FileExists(p) {
			env.Files[filepath.Join(CNIBinDir, name)] = p
		}
	}
	// iptables for the portmap plugin: the machine's program (a link to xtables-nft-multi, which picks its
	// mode from its name: copied as IptablesBin it is iptables) and the extensions it loads at run time.
	if p, err := exec.LookPath("iptables"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			env.Files[IptablesBin] = real
			exts, _ := filepath.Glob("/usr/lib/*/xtables")
			for _, d := range append(exts, "/usr/lib/xtables") {
				if st, err := os.Stat(d); err == nil && st.IsDir() {
					env.Files[d] = d
				}
			}
		}
	}
	return env, nil
}
