package checkpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// concurrentCreates is how many sandboxes TestCubeAPIConcurrentCreate asks
// cube-api for at once (issue 15: "10 creates at once").
const concurrentCreates = 10

// warmRounds is how many sandboxes TestCubeAPIConcurrentCreate creates and
// deletes one at a time before its creates at once.
const warmRounds = 3

// idleCommand is the sandboxes' main process in TestCubeAPIConcurrentCreate:
// ten sandboxes each running cubetest.CounterScript (two forks every 0.1 s)
// keep the 1-vCPU test host's CPU busy — creates then take over a minute
// and each command about one — which measures the test host, not cube-api.
const idleCommand = "exec sleep 1000000"

// TestCubeAPIConcurrentCreate creates concurrentCreates sandboxes from one
// template at the same time through the SDK: every create succeeds, every
// sandbox runs a command and answers with its own output, all are listed
// running, and all are deleted. When the creates or the commands are not
// all back within stuckAfter, the shims' goroutine stacks (SIGUSR1, into
// containerd's log) are printed: a hang shows where it waits.
func TestCubeAPIConcurrentCreate(t *testing.T) {
	d := startDaemons(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, _ := d.newAPI(t, ctx, idleCommand)
	tp, err := c.BuildTemplate(ctx, cubetest.ImageRef, cube.BuildTemplateOptions{TemplateID: "conc-tpl"})
	if err != nil {
		t.Fatalf("build a template: %v", err)
	}
	t.Cleanup(func() {
		if err := c.DeleteTemplate(context.Background(), tp.TemplateID); err != nil {
			t.Errorf("delete template %s: %v", tp.TemplateID, err)
		}
	})

	// As BenchmarkCubeAPI does before its 10: creates one at a time, each
	// deleted (a benchmark's c=1 rows). The 10 at once once hung after such
	// rounds and never without them.
	for i := range warmRounds {
		sb, err := c.Create(ctx, cube.CreateOptions{Template: tp.TemplateID, Timeout: 600})
		if err != nil {
			t.Fatalf("create %d of %d one at a time: %v", i+1, warmRounds, err)
		}
		if err := sb.Kill(ctx); err != nil {
			t.Fatalf("kill %s (create %d one at a time): %v", sb.ID, i+1, err)
		}
	}

	from := d.LogSize()
	made := make([]*cube.Sandbox, concurrentCreates)
	errs := make([]error, concurrentCreates)
	took := make([]time.Duration, concurrentCreates)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range concurrentCreates {
		wg.Go(func() {
			t0 := time.Now()
			made[i], errs[i] = c.Create(ctx, cube.CreateOptions{Template: tp.TemplateID, Timeout: 600,
				Metadata: map[string]string{"n": fmt.Sprint(i)}})
			took[i] = time.Since(t0)
		})
	}
	d.waitOrStacks(t, &wg, from, "creates")
	t.Logf("%d creates at once: wall %v, each %v", concurrentCreates, time.Since(start).Round(time.Millisecond), took)
	t.Cleanup(func() {
		for _, sb := range made {
			if sb != nil {
				if err := sb.Kill(context.Background()); err != nil && !cube.IsNotFound(err) {
					t.Errorf("kill %s: %v", sb.ID, err)
				}
			}
		}
	})
	ids := map[string]bool{}
	for i, sb := range made {
		if errs[i] != nil {
			t.Errorf("create %d of %d at once: %v", i, concurrentCreates, errs[i])
			continue
		}
		if ids[sb.ID] {
			t.Errorf("create %d: sandbox id %s twice", i, sb.ID)
		}
		ids[sb.ID] = true
	}
	// A command in each, all at once: each prints its own sandbox's number.
	start = time.Now()
	for i, sb := range made {
		if sb == nil {
			continue
		}
		wg.Go(func() {
			t0 := time.Now()
			defer func() { took[i] = time.Since(t0) }()
			res, err := sb.Commands.Run(ctx, fmt.Sprintf("echo sandbox-%d", i), cube.RunOptions{})
			if err != nil {
				t.Errorf("sandbox %d (%s): run a command: %v", i, sb.ID, err)
				return
			}
			if got, want := strings.TrimSpace(res.Stdout), fmt.Sprintf("sandbox-%d", i); got != want {
				t.Errorf("sandbox %d (%s): the command printed %q, want %q", i, sb.ID, got, want)
			}
		})
	}
	d.waitOrStacks(t, &wg, from, "commands")
	t.Logf("a command in each at once: wall %v, each %v", time.Since(start).Round(time.Millisecond), took)
	if t.Failed() {
		t.Logf("containerd's log about the sandboxes since the creates:\n%s", cubetest.LastLines(d.VMMLog(from), 200))
		return
	}
	list, _, err := c.List(ctx, cube.ListOptions{Limit: 100})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	listed := 0
	for _, info := range list {
		if ids[info.SandboxID] && info.State == "running" {
			listed++
		}
	}
	if listed != concurrentCreates {
		t.Errorf("list: %d of the %d sandboxes listed running: %+v", listed, concurrentCreates, list)
	}
}

// waitOrStacks waits for wg; when what is not all back within stuckAfter,
// the test fails with the shims' stacks and the test host's load, and
// waits on.
func (d *daemons) waitOrStacks(t testing.TB, wg *sync.WaitGroup, from int64, what string) {
	t.Helper()
	const stuckAfter = 3 * time.Minute
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(stuckAfter):
		load, _ := os.ReadFile("/proc/loadavg")
		t.Errorf("%d %s at once: not all back after %v (load average %s; %s); the shims' stacks:\n%s",
			concurrentCreates, what, stuckAfter, strings.TrimSpace(string(load)), memSummary(), d.shimStacks(from))
		<-done
	}
}

// shimStacks makes every running io.cube.v1 shim log its goroutines
// (containerd's shim package does on SIGUSR1 when it runs with -debug, as
// the test's containerd at debug level starts it) and returns what
// containerd's log got since from.
func (d *daemons) shimStacks(from int64) string {
	var pids []int
	for _, pid := range cubetest.ProcsNamed("containerd-shim-cube-v1") {
		if syscall.Kill(pid, syscall.SIGUSR1) == nil {
			pids = append(pids, pid)
		}
	}
	time.Sleep(3 * time.Second)
	var b strings.Builder
	fmt.Fprintf(&b, "signalled shims %v\n", pids)
	for _, l := range strings.Split(d.LogFrom(from), "\n") {
		if strings.Contains(l, "goroutine") || strings.Contains(l, "level=") && (strings.Contains(l, "shim") || strings.Contains(l, "runtime")) {
			b.WriteString(l + "\n")
		}
	}
	b.WriteString(vmmStates(d.LogFrom(from)))
	s := b.String()
	if len(s) > 400<<10 {
		s = s[len(s)-400<<10:]
	}
	return s
}

// memSummary is the test host's memory as /proc/meminfo tells it: total,
// available, and what tmpfs (the state directories) holds.
func memSummary() string {
	b, _ := os.ReadFile("/proc/meminfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"MemTotal:", "MemAvailable:", "Shmem:"} {
			if strings.HasPrefix(l, k) {
				out = append(out, strings.Join(strings.Fields(l), " "))
			}
		}
	}
	return strings.Join(out, ", ")
}

// vmmStates describes every cube-vmm process for a hang report: its
// threads (cubetest.ProcThreads), its VM directory's files and console
// tail, and what its shim logged of it (log: containerd's, since the hang's
// start).
func vmmStates(log string) string {
	var b strings.Builder
	b.WriteString(cubetest.BusyThreads())
	for _, pid := range cubetest.ProcsNamed("cube-vmm") {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmd), "\x00")
		dir := ""
		for i, a := range args {
			if a == "-control" && i+1 < len(args) {
				dir = filepath.Dir(args[i+1])
			}
		}
		id := shimIDOf(pid)
		fmt.Fprintf(&b, "\ncube-vmm pid %d (%s, shim of %s) threads:%s\n", pid, dir, id, cubetest.ProcThreads(pid))
		if dir == "" {
			continue
		}
		if ents, err := os.ReadDir(dir); err == nil {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			fmt.Fprintf(&b, "  files: %s\n", strings.Join(names, " "))
		}
		if con, err := os.ReadFile(filepath.Join(dir, "console.log")); err == nil {
			fmt.Fprintf(&b, "  console tail:\n%s\n", cubetest.LastLines(string(con), 5))
		}
		for _, l := range strings.Split(log, "\n") {
			if (strings.Contains(l, filepath.Base(dir)) || id != "" && strings.Contains(l, "id="+id)) && !strings.Contains(l, "goroutine") {
				fmt.Fprintf(&b, "  log: %s\n", l)
			}
		}
	}
	return b.String()
}

// shimIDOf is the -id of process pid's parent (a cube-vmm's shim), or "".
func shimIDOf(pid int) string {
	st, ok := cubetest.ReadStat(fmt.Sprintf("/proc/%d/stat", pid))
	if !ok {
		return ""
	}
	cmd, _ := os.ReadFile("/proc/" + st.PPID + "/cmdline")
	args := strings.Split(string(cmd), "\x00")
	for i, a := range args {
		if a == "-id" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
