package checkpoint

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/integration/testhost"
)

// demoBin is contrib/sdk/go/examples/demo in the test host (TestMain builds it).
const demoBin = "/cube/bin/cube-demo"

// The demo from the machine's shell (`make demo`, contrib/scripts/demo.sh): CUBE_DEMO_PORT=P on the machine
// forwards 127.0.0.1:P to cube-api in the test host and P+1 to the "done" port; TestDemo then serves the
// stack (envDemoServe inside) until the client outside posts /done.
const (
	envDemoPort  = "CUBE_DEMO_PORT"
	envDemoServe = "CUBE_DEMO_SERVE"
	demoAPIPort  = 3000
	demoDonePort = 3001
	// demoServeLimit bounds the serve mode (the test host's own bound, TestMain's, is 10 minutes more).
	demoServeLimit = 35 * time.Minute
)

// demoForwards are the test host's forwards when CUBE_DEMO_PORT is set (nil otherwise).
func demoForwards() ([]testhost.Forward, error) {
	v := os.Getenv(envDemoPort)
	if v == "" {
		return nil, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 1024 || p > 65534 {
		return nil, fmt.Errorf("%s=%q: want a free TCP port 1024..65534 on 127.0.0.1 (it and the next one are forwarded to the test host)", envDemoPort, v)
	}
	return []testhost.Forward{{HostPort: p, GuestPort: demoAPIPort}, {HostPort: p + 1, GuestPort: demoDonePort}}, nil
}

// TestDemo is the Go twin of `make demo` (which runs the Python SDK's demo
// from the machine against TestDemo's serve mode): contrib/sdk/go/examples/demo, unchanged, against a cube-api on the real
// containerd, shim and VMM. The program checks each of its steps (a
// background process, a snapshot, a destructive change, a rollback in place
// that brings the file and the process with its PID back, a fork of 2 whose
// copies start from that state and then diverge) and exits 1 when one does
// not hold; its lines are the test's log. Afterwards nothing it made remains.
func TestDemo(t *testing.T) {
	d := startDaemons(t)
	// Serving, the clients outside take their time: `make e2e-sdk` runs E2B's JS SDK and then the Python SDK's
	// acceptance against the same cube-api (about 15 minutes together in a 1-vCPU test host).
	limit := 15 * time.Minute
	if os.Getenv(envDemoServe) == "1" {
		limit = demoServeLimit
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	d.importForAPI(t, ctx)
	if os.Getenv(envDemoServe) == "1" {
		d.serveDemo(t, ctx)
		d.checkAPINamespaceEmpty(t, ctx)
		return
	}
	addr := freeAddr(t)
	d.startAPI(t, addr)

	cmd := exec.CommandContext(ctx, demoBin, "-template", cubetest.ImageRef, "-fork", "2")
	cmd.Env = append(os.Environ(), "CUBE_API_URL=http://"+addr, "CUBE_API_KEY="+apiKey)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the demo: %v", err)
	}
	var lines []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.Log(sc.Text())
			lines = append(lines, sc.Text())
		}
	}()
	wg.Wait()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the demo failed: %v", err)
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{"rolled back in place", "forked 2 copies", "every step held", "cleaned up: 3 sandboxes killed, 1 snapshots deleted"} {
		if !strings.Contains(all, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	// Nothing the demo made remains in cube-api's namespace.
	d.checkAPINamespaceEmpty(t, ctx)
}

// checkAPINamespaceEmpty fails the test when a container is left in cube-api's namespace.
func (d *daemons) checkAPINamespaceEmpty(t *testing.T, ctx context.Context) {
	t.Helper()
	ls := exec.CommandContext(ctx, cubetest.CtrBin, "--address", d.Dir+"/containerd.sock", "--namespace", apiNamespace, "containers", "ls", "-q")
	ls.Env = d.Env
	left, err := ls.CombinedOutput()
	if err != nil {
		t.Fatalf("ctr containers ls: %v\n%s", err, left)
	}
	if s := strings.TrimSpace(string(left)); s != "" {
		t.Errorf("containers left after the demo: %s", s)
	}
}

// serveDemo runs cube-api on the forwarded port (all addresses: the forward arrives on eth0; its API key is
// the e2e one, which the script outside uses) and waits for POST /done on the other forwarded port, or the
// context's end. The same port restarts the stack under the client (the SDK acceptance,
// contrib/sdk/python/examples/acceptance.py): POST /restart-api stops cube-api gracefully (SIGTERM) and starts
// it again on the same port and store, answering once /health does; POST /restart-containerd stops
// containerd (SIGTERM, as an operator would) and starts it again on the same root and state, answering once
// it serves. Either answers 200 with what it did, or 500 naming what failed (the test fails too).
func (d *daemons) serveDemo(t *testing.T, ctx context.Context) {
	apiAddr := fmt.Sprintf("0.0.0.0:%d", demoAPIPort)
	stopAPI := d.startAPI(t, apiAddr)
	done := make(chan struct{})
	var once sync.Once
	var restartMu sync.Mutex // one restart at a time
	restart := func(w http.ResponseWriter, what string, fn func() error) {
		restartMu.Lock()
		defer restartMu.Unlock()
		start := time.Now()
		if err := fn(); err != nil {
			t.Errorf("demo: %s: %v", what, err)
			http.Error(w, what+": "+err.Error(), http.StatusInternalServerError)
			return
		}
		t.Logf("demo: %s in %v", what, time.Since(start).Round(time.Millisecond))
		fmt.Fprintf(w, "%s in %v\n", what, time.Since(start).Round(time.Millisecond))
	}
	srv := &http.Server{Addr: fmt.Sprintf(":%d", demoDonePort), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST /done ends the demo's test host; POST /restart-api, /restart-containerd restart them", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Path {
		case "/done":
			once.Do(func() { close(done) })
		case "/restart-api":
			restart(w, "cube-api restarted", func() error {
				stopAPI()
				s, err := d.startAPIErr(t, apiAddr, cubetest.CounterScript)
				if err != nil {
					return err
				}
				stopAPI = s
				return nil
			})
		case "/restart-containerd":
			restart(w, "containerd restarted", func() error {
				if err := d.Containerd.Process.Signal(syscall.SIGTERM); err != nil {
					return fmt.Errorf("SIGTERM containerd: %w", err)
				}
				if err := d.Containerd.Wait(); err != nil {
					t.Logf("demo: containerd's exit: %v", err)
				}
				return d.StartContainerd()
			})
		default:
			http.Error(w, "POST /done ends the demo's test host; POST /restart-api, /restart-containerd restart them", http.StatusNotFound)
		}
	})}
	go srv.ListenAndServe()
	defer srv.Close()
	t.Logf("demo: cube-api serves on the forwarded port %d (key %s); waiting for POST /done on %d", demoAPIPort, apiKey, demoDonePort)
	fmt.Println("CUBE-DEMO-READY")
	select {
	case <-done:
		t.Log("demo: the client is done")
	case <-ctx.Done():
		t.Fatalf("demo: no POST /done before the deadline: %v", ctx.Err())
	}
	// The client deletes the snapshots it takes (the containers are checked by the caller).
	c := &cube.Client{URL: fmt.Sprintf("http://127.0.0.1:%d", demoAPIPort), APIKey: apiKey}
	if l, _, err := c.ListSnapshots(ctx, cube.ListSnapshotsOptions{}); err != nil || len(l) != 0 {
		t.Errorf("snapshots left after the client: %+v %v", l, err)
	}
}
