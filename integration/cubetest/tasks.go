package cubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// CounterScript counts in /count every 100 ms. The file is replaced by a rename, so a reader (cat, or the
// agent's ReadFile in a restored VM, which may run before the guest's next instruction) never sees it
// truncated and empty.
const CounterScript = "i=0; while :; do i=$((i+1)); echo $i > /count.new; busybox mv -f /count.new /count; sleep 0.1; done"

// ReadCounter reads CounterScript's /count in container id (a `ctr task exec` of cat).
func (d *Daemons) ReadCounter(t testing.TB, id string) int {
	t.Helper()
	out, rc, err := d.CtrQuiet(nil, "task", "exec", "--exec-id", fmt.Sprintf("c%d", time.Now().UnixNano()), id, "cat", "/count")
	n, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || rc != 0 || perr != nil {
		t.Fatalf("%s: read the counter: rc %d %v %v\n%s", id, rc, err, perr, out)
	}
	return n
}

// Runtime is one way to run a container through ctr: io.cube.v1 on the cube
// snapshotter, or runc on overlayfs as the reference for exit codes and signals.
type Runtime struct {
	Name string
	Args []string // ctr run flags
}

var (
	CubeRuntime = Runtime{"cube", []string{"--runtime", "io.cube.v1", "--snapshotter", "cube"}}
	// pivot_root fails when / is the test host's initramfs.
	RuncRuntime = Runtime{"runc", []string{"--runtime", "io.containerd.runc.v2", "--no-pivot"}}
)

// Runtimes is io.cube.v1, then runc when the test host has it (every
// scenario expects the same from both: runc is what "exactly as runc" means).
func Runtimes(t *testing.T) []Runtime {
	if _, err := os.Stat("/cube/bin/runc"); err != nil {
		t.Log("runc not in the test host (not found on the machine): io.cube.v1 only, no side-by-side comparison")
		return []Runtime{CubeRuntime}
	}
	return []Runtime{CubeRuntime, RuncRuntime}
}

// BG is a ctr command running in the background.
type BG struct {
	cmd  *exec.Cmd
	mu   sync.Mutex // out is written by exec's copy goroutines
	out  *bytes.Buffer
	done chan struct{}
	rc   int
	err  error
}

// CtrBG starts ctr without waiting for it (a foreground `ctr run` or `ctr
// task exec` whose exit status the test reads later).
func (d *Daemons) CtrBG(t *testing.T, args ...string) *BG {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b := &BG{cmd: d.CtrCmd(ctx, args...), out: &bytes.Buffer{}, done: make(chan struct{})}
	w := lockedWriter{&b.mu, b.out}
	b.cmd.Stdout, b.cmd.Stderr = w, w
	b.cmd.WaitDelay = 10 * time.Second
	if err := b.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start ctr %v: %v", args, err)
	}
	go func() {
		defer cancel()
		defer close(b.done)
		b.err = b.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(b.err, &ee) {
			b.rc, b.err = ee.ExitCode(), nil
		}
	}()
	t.Cleanup(func() {
		b.cmd.Process.Kill()
		<-b.done
	})
	return b
}

// WaitOutput waits until the background ctr has printed want.
func (b *BG) WaitOutput(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		b.mu.Lock()
		ok := strings.Contains(b.out.String(), want)
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-b.done:
			t.Fatalf("ctr %v exited (rc %d) without printing %q:\n%s", b.cmd.Args[5:], b.rc, want, b.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctr %v: no %q after %v", b.cmd.Args[5:], want, within)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Wait returns the background ctr's exit status and output.
func (b *BG) Wait(t *testing.T, within time.Duration) (int, string) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(within):
		b.mu.Lock()
		defer b.mu.Unlock()
		t.Fatalf("ctr %v still running after %v; output:\n%s", b.cmd.Args[5:], within, b.out)
	}
	t.Logf("ctr %s: rc %d\n%s", strings.Join(b.cmd.Args[5:], " "), b.rc, b.out)
	if b.err != nil {
		t.Fatalf("ctr %v: %v", b.cmd.Args[5:], b.err)
	}
	return b.rc, b.out.String()
}

// TaskInfo is one line of `ctr task ls`.
type TaskInfo struct {
	PID    int
	Status string
}

// Tasks parses `ctr task ls` (TASK PID STATUS).
func (d *Daemons) Tasks(t testing.TB) map[string]TaskInfo {
	t.Helper()
	out, rc, err := d.CtrQuiet(nil, "task", "ls")
	if err != nil || rc != 0 {
		t.Fatalf("ctr task ls: rc %d %v\n%s", rc, err, out)
	}
	m := map[string]TaskInfo{}
	for _, l := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		pid, _ := strconv.Atoi(f[1])
		m[f[0]] = TaskInfo{pid, f[2]}
	}
	return m
}

// WaitStatus polls `ctr task ls` until the task has the status.
func (d *Daemons) WaitStatus(t testing.TB, id, status string, within time.Duration) TaskInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		tk, ok := d.Tasks(t)[id]
		if ok && tk.Status == status {
			return tk
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: %+v (listed: %v), want %s within %v", id, tk, ok, status, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RunDetached starts a long-running container (`ctr run -d`) and removes it
// (task and container) when the test ends.
func (d *Daemons) RunDetached(t *testing.T, rt Runtime, id string, cmd ...string) TaskInfo {
	t.Helper()
	args := append(append([]string{"run", "-d"}, rt.Args...), ImageRef, id)
	if out, rc, err := d.Ctr(append(args, cmd...)...); err != nil || rc != 0 {
		t.Fatalf("%s: ctr run -d: rc %d %v\n%s", rt.Name, rc, err, out)
	}
	t.Cleanup(func() { d.Remove(t, id) })
	return d.WaitStatus(t, id, "RUNNING", time.Minute)
}

// Remove force-deletes a container's task and the container.
func (d *Daemons) Remove(t testing.TB, id string) {
	if _, ok := d.Tasks(t)[id]; ok {
		if out, rc, err := d.CtrQuiet(nil, "task", "rm", "-f", id); err != nil || rc != 0 {
			t.Errorf("ctr task rm -f %s: rc %d %v\n%s", id, rc, err, out)
		}
	}
	if out, rc, err := d.CtrQuiet(nil, "container", "rm", id); err != nil || rc != 0 {
		t.Errorf("ctr container rm %s: rc %d %v\n%s", id, rc, err, out)
	}
}
