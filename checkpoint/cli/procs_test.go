package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// startProcs gives the world's guest container c1 a running init and exec e1 (both "sleep": they run until
// signalled), as the shim would have made them.
func startProcs(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	serial := ""
	for s, path := range w.vmm.Disks { // the sandbox's rootfs drive, as the shim would mount it
		if path == "/img/c1.ext4" {
			serial = s
		}
	}
	md, err := w.agent.MountDisk(ctx, sandbox.MountDiskRequest{Serial: serial, MountPoint: "/run/cube/c1", FSType: "ext4"})
	mp := md.MountPoint
	if err != nil {
		t.Fatalf("mount the rootfs drive (disks %v): %v", w.vmm.Disks, err)
	}
	spec := `{"ociVersion":"1.2.0","process":{"args":["sleep"]},"root":{"path":"/run/cube/c1"}}`
	if _, err := w.agent.CreateContainer(ctx, sandbox.CreateContainerRequest{ContainerID: "c1", Spec: []byte(spec), Rootfs: mp}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.agent.ExecProcess(ctx, sandbox.ExecProcessRequest{ContainerID: "c1", ExecID: "e1", Process: []byte(`{"args":["sleep"]}`)}); err != nil {
		t.Fatal(err)
	}
	for _, eid := range []string{"", "e1"} {
		if _, _, err := w.agent.Start(ctx, "c1", eid); err != nil {
			t.Fatal(err)
		}
	}
}

func psJSON(t *testing.T, w *world) map[string]Process {
	t.Helper()
	out, _ := w.cube(t, ExitOK, "ps", "c1", "--json")
	var l []Process
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("cube ps --json: %v\n%s", err, out)
	}
	m := map[string]Process{}
	for _, p := range l {
		m[p.Container+"/"+p.Exec] = p
	}
	return m
}

// waitStopped waits until the fake guest's process c1/eid has ended.
func waitStopped(t *testing.T, w *world, eid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.agent.ProcessStatus("c1", eid) != "stopped" {
		if time.Now().After(deadline) {
			t.Fatalf("c1/%s still %s", eid, w.agent.ProcessStatus("c1", eid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPsAndKillCommands(t *testing.T) {
	w := newWorld(t)
	startProcs(t, w)
	out, _ := w.cube(t, ExitOK, "ps", "c1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "CONTAINER") || !strings.Contains(lines[1], "(init)") ||
		!strings.Contains(lines[2], "e1") || !strings.Contains(out, "running") {
		t.Fatalf("cube ps:\n%s", out)
	}
	m := psJSON(t, w)
	if p := m["c1/e1"]; p.Status != "running" || p.PID == 0 || p.ExitStatus != nil || p.Known {
		// oneVM's GuestProcesses is the agent's list: nothing is marked known.
		t.Fatalf("ps --json e1: %+v", p)
	}

	w.cube(t, ExitOK, "kill", "c1", "--exec", "e1", "-s", "KILL")
	waitStopped(t, w, "e1")
	if p := psJSON(t, w)["c1/e1"]; p.Status != "stopped" || p.ExitStatus == nil || *p.ExitStatus != 137 || p.ExitedAt == nil {
		t.Fatalf("after cube kill -s KILL of e1: %+v", p)
	}
	if p := psJSON(t, w)["c1/"]; p.Status != "running" {
		t.Fatalf("the init after e1's kill: %+v", p)
	}
	// The default signal is TERM, as ctr task kill's.
	w.cube(t, ExitOK, "kill", "c1")
	waitStopped(t, w, "")
	if p := psJSON(t, w)["c1/"]; p.ExitStatus == nil || *p.ExitStatus != 143 {
		t.Fatalf("after cube kill of the init: %+v", p)
	}
	if out, _ := w.cube(t, ExitOK, "ps", "c1"); !strings.Contains(out, "stopped (143)") || !strings.Contains(out, "stopped (137)") {
		t.Errorf("cube ps after the kills:\n%s", out)
	}
}

func TestKillRefuses(t *testing.T) {
	w := newWorld(t)
	startProcs(t, w)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"kill", "c1", "--all", "--exec", "e1"}, ExitUsage, "without --exec"},
		{[]string{"kill", "c1", "--signal", "NOPE"}, ExitUsage, `"NOPE": not a signal`},
		{[]string{"kill", "c1", "-s", "65"}, ExitUsage, "1..64"},
		{[]string{"kill", "c1", "-s", "0"}, ExitUsage, "1..64"},
		{[]string{"kill"}, ExitUsage, "want CONTAINER"},
		{[]string{"ps", "c1", "c2"}, ExitUsage, "want CONTAINER"},
		{[]string{"kill", "c1", "--exec", "nope"}, ExitFailure, "nope"},
		{[]string{"kill", "nosuch"}, ExitFailure, "nosuch"},
		{[]string{"ps", "runc"}, ExitFailure, "io.containerd.runc.v2"},
	} {
		_, errOut := w.cube(t, c.code, c.args...)
		if !strings.Contains(errOut, c.want) {
			t.Errorf("cube %s: stderr lacks %q:\n%s", strings.Join(c.args, " "), c.want, errOut)
		}
	}
	// Nothing was signalled by the refused commands.
	for _, eid := range []string{"", "e1"} {
		if st := w.agent.ProcessStatus("c1", eid); st != "running" {
			t.Errorf("c1/%s is %s after refused commands", eid, st)
		}
	}
	for _, c := range []string{"ps", "kill"} {
		if out, _ := w.cube(t, ExitOK, c, "--help"); !strings.Contains(out, "Usage: cube "+c) {
			t.Errorf("cube %s --help:\n%s", c, out)
		}
		if out, _ := w.cube(t, ExitOK, "help", c); !strings.Contains(out, "Usage: cube "+c) {
			t.Errorf("cube help %s:\n%s", c, out)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]uint32{"TERM": 15, "SIGKILL": 9, "kill": 9, "usr1": 10, "9": 9, "64": 64} {
		if got, err := parseSignal(in); err != nil || got != want {
			t.Errorf("parseSignal(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "SIG", "0", "65", "-1", "TERMINATE"} {
		if _, err := parseSignal(in); err == nil {
			t.Errorf("parseSignal(%q): no error", in)
		}
	}
}
