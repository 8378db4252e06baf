package shim

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// demoBin is contrib/sdk/go/examples/demo in the test host (TestMain builds it).
const demoBin = "/cube/bin/cube-demo"

// TestDemo is `make demo`: the SDK story a user runs against cube-api —
// contrib/sdk/go/examples/demo, unchanged, against a cube-api on the real
// containerd, shim and VMM. The program checks each of its steps (a
// background process, a snapshot, a destructive change, a rollback in place
// that brings the file and the process with its PID back, a fork of 2 whose
// copies start from that state and then diverge) and exits 1 when one does
// not hold; its lines are the test's log. Afterwards nothing it made remains.
func TestDemo(t *testing.T) {
	d := startDaemons(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	d.importForAPI(t, ctx)
	addr := freeAddr(t)
	d.startAPI(t, addr)

	cmd := exec.CommandContext(ctx, demoBin, "-template", imageRef, "-fork", "2")
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
	ls := exec.CommandContext(ctx, ctrBin, "--address", d.dir+"/containerd.sock", "--namespace", apiNamespace, "containers", "ls", "-q")
	ls.Env = d.env
	left, err := ls.CombinedOutput()
	if err != nil {
		t.Fatalf("ctr containers ls: %v\n%s", err, left)
	}
	if s := strings.TrimSpace(string(left)); s != "" {
		t.Errorf("containers left after the demo: %s", s)
	}
}
