package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/cubetest"
	"github.com/cube-runtime/cube/shim/standby"
	"github.com/cube-runtime/cube/shim/template"
)

// TestStandbyVMs: with standby = true, a sandbox restored from a template
// leaves a standby VM of it and the next sandbox adopts it (and leaves
// another); a standby whose VMM died is passed over (the sandbox restores its
// own VM, and the dead one's directory goes); `cube templates ls` shows the
// standbys and `cube templates rm` stops them with their template. A fresh
// template_dir, so that removing its template leaves the shared one alone.
func TestStandbyVMs(t *testing.T) {
	d := startDaemons(t)
	tdir := filepath.Join(d.Dir, "templates-standby")
	stateDir := filepath.Join(d.Dir, "vms")
	conf := d.shimConfWith(t, "shim-standby.toml", cubetest.GuestInitrd, fmt.Sprintf("template_dir = %q\nstandby = true\n", tdir))
	// free waits for the one free standby the last run left (it is
	// published just after that sandbox started).
	free := func() standby.Standby {
		t.Helper()
		var l []standby.Standby
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var err error
			if l, err = standby.List(stateDir); err != nil {
				t.Fatal(err)
			}
			if len(l) > 0 {
				break
			}
		}
		if len(l) != 1 || !strings.HasPrefix(l[0].Record.Template, tdir+"/") {
			t.Fatalf("free standbys: %+v, want one of a template in %s", l, tdir)
		}
		return l[0]
	}

	log1 := d.runEcho(t, conf, "stb1")
	if !strings.Contains(log1, cubetest.LogRestoring) || !strings.Contains(log1, cubetest.LogStandbyStarted) || strings.Contains(log1, cubetest.LogAdopted) {
		t.Fatalf("first run: want a restore from the template and a standby left for the next; shim log:\n%s", cubetest.GrepLines(log1, "standby"))
	}
	left1 := free()

	log2 := d.runEcho(t, conf, "stb2")
	if !strings.Contains(log2, cubetest.LogAdopted) || !strings.Contains(log2, "standby="+left1.Dir) {
		t.Fatalf("second run: want the standby %s adopted; shim log:\n%s", left1.Dir, cubetest.GrepLines(log2, "standby"))
	}
	if _, err := os.Stat(left1.Dir); !os.IsNotExist(err) {
		t.Errorf("the adopted standby's directory outlived its sandbox: %v", err)
	}
	left2 := free()

	// A standby whose VMM died is passed over.
	if err := syscall.Kill(left2.Record.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, left2, "after SIGKILL")
	log3 := d.runEcho(t, conf, "stb3")
	if strings.Contains(log3, cubetest.LogAdopted) || !strings.Contains(log3, cubetest.LogRestoring) {
		t.Fatalf("third run: want a restore of its own past the dead standby; shim log:\n%s", cubetest.GrepLines(log3, "standby"))
	}
	if _, err := os.Stat(left2.Dir); !os.IsNotExist(err) {
		t.Errorf("the dead standby's directory is left: %v", err)
	}
	left3 := free()

	keys, err := template.List(tdir)
	if err != nil || len(keys) != 1 {
		t.Fatalf("templates in %s: %+v, %v", tdir, keys, err)
	}
	out, rc := d.Cube(t, "templates", "ls", "--dir", tdir)
	if rc != 0 || !strings.Contains(out, keys[0].Key) || !strings.Contains(out, "1 standby VM(s) ready") {
		t.Fatalf("cube templates ls: rc %d, want the standby shown:\n%s", rc, out)
	}
	if out, rc := d.Cube(t, "templates", "rm", "--dir", tdir, keys[0].Key); rc != 0 {
		t.Fatalf("cube templates rm: rc %d\n%s", rc, out)
	}
	if l, err := standby.List(stateDir); err != nil || len(l) != 0 {
		t.Errorf("standbys after rm: %+v, %v", l, err)
	}
	waitGone(t, left3, "after its template was removed")
}

// waitGone waits up to 10 s for the VMM of standby s to be gone (why: when
// it should have gone) and fails t if it still runs.
func waitGone(t *testing.T, s standby.Standby, why string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); standby.Alive(s.Record.Pid, s.Record.StartTime); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("standby vmm pid %d still runs %s", s.Record.Pid, why)
		}
	}
}
