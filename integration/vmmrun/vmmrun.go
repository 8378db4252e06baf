// Package vmmrun runs cube-vmm as a child process for end-to-end tests: it captures the guest console
// (stdout), parses "KEY=value" result lines a test guest prints, and reports the exit status. The process
// group is killed when the test ends.
package vmmrun

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is one cube-vmm process with its console parsed into KEY=value results.
type Process struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	console bytes.Buffer
	stderr  bytes.Buffer
	results map[string]string
	lines   chan string
	done    chan struct{}
	exit    int
}

func Start(t testing.TB, binary string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &Process{cmd: cmd, results: map[string]string{}, lines: make(chan string, 1024), done: make(chan struct{})}
	cmd.Stderr = lockedWriter{&r.mu, &r.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cube-vmm: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			r.mu.Lock()
			r.console.WriteString(line + "\n")
			if k, v, ok := strings.Cut(line, "="); ok && k != "" && strings.ToUpper(k) == k && !strings.ContainsAny(k, " []") {
				r.results[k] = v
			}
			r.mu.Unlock()
			select {
			case r.lines <- line:
			default:
			}
		}
		err := cmd.Wait()
		r.exit = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			r.exit = ee.ExitCode()
		} else if err != nil {
			r.exit = -1
		}
		close(r.done)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	})
	return r
}

// waitLine waits for a console line containing s.
func (r *Process) WaitLine(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-r.lines:
			if strings.Contains(l, s) {
				return
			}
		case <-r.done:
			t.Fatalf("cube-vmm exited (%d) before %q; console:\n%s\nstderr:\n%s", r.exit, s, r.ConsoleTail(), r.Stderr())
		case <-deadline:
			t.Fatalf("no %q on the console within %v; console:\n%s", s, timeout, r.ConsoleTail())
		}
	}
}

// Wait waits for cube-vmm to exit and returns its status.
func (r *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	st, err := r.WaitErr(timeout)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// WaitErr is Wait returning an error, with the console tail, if cube-vmm still runs after timeout.
func (r *Process) WaitErr(timeout time.Duration) (int, error) {
	select {
	case <-r.done:
		return r.exit, nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("cube-vmm still running after %v; console:\n%s", timeout, r.ConsoleTail())
	}
}

// Exited reports cube-vmm's exit status if it has ended, without waiting.
func (r *Process) Exited() (int, bool) {
	select {
	case <-r.done:
		return r.exit, true
	default:
		return 0, false
	}
}

func (r *Process) Result(k string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.results[k]
}

func (r *Process) ConsoleTail() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return tail(r.console.String(), 40)
}

// Stderr returns what cube-vmm wrote to stderr (its logs and failure messages).
func (r *Process) Stderr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stderr.String()
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// lockedWriter lets exec's copying goroutine append to a buffer the test reads concurrently.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Kill sends SIGKILL to cube-vmm's process group at once (as a crash or an OOM kill would), without waiting.
func (r *Process) Kill() error { return syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL) }
