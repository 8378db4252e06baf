package initsys

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func startCmd(t *testing.T, r *Reaper, name string, args ...string) (int, <-chan Exit) {
	t.Helper()
	pid, ch, err := r.Start(func() (int, error) {
		c := exec.Command(name, args...)
		if err := c.Start(); err != nil {
			return 0, err
		}
		return c.Process.Pid, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pid, ch
}

func TestReaper(t *testing.T) {
	r, err := NewReaper(logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	_, ch := startCmd(t, r, "/bin/sh", "-c", "exit 7")
	if e := <-ch; e.Code() != 7 {
		t.Errorf("exit 7: got status %d", e.Code())
	}
	pid, ch := startCmd(t, r, "/bin/sleep", "100")
	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if e := <-ch; e.Code() != 128+15 || !e.Status.Signaled() {
		t.Errorf("SIGTERM: got status %d", e.Code())
	}

	// An orphan (grandchild whose parent exited) is reparented to us as
	// subreaper and must be reaped: its /proc entry (a zombie keeps one) goes.
	pidFile := t.TempDir() + "/pid"
	_, ch = startCmd(t, r, "/bin/sh", "-c", "sleep 0.2 & echo $! > "+pidFile)
	<-ch
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var orphan int
	if _, err := fmt.Sscan(string(b), &orphan); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", orphan))
			t.Fatalf("orphan %d not reaped: %s", orphan, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
