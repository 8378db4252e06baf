package testhost

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// fatalConsole matches test-host kernel messages after which the run cannot succeed: the kernel is stuck or
// dead. (An RCU stall alone can be transient under TCG, so only the self-detected form, which names a CPU
// stuck in the kernel, counts.)
var fatalConsole = regexp.MustCompile(`watchdog: BUG: soft lockup - CPU#\d+ stuck for \d+s!.*|` +
	`rcu: INFO: rcu_preempt self-detected stall on CPU|Kernel panic - not syncing:.*`)

// watchConsole polls the console file and calls fatal once with the first matching line. It stops when done
// is closed.
func watchConsole(path string, done <-chan struct{}, fatal func(line string)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var off int64
	var carry []byte
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		buf := make([]byte, 256*1024)
		n, _ := f.ReadAt(buf, off)
		f.Close()
		if n == 0 {
			continue
		}
		off += int64(n)
		data := append(carry, buf[:n]...)
		// Keep an unfinished last line for the next round.
		cut := bytes.LastIndexByte(data, '\n')
		if cut < 0 {
			carry = data
			continue
		}
		carry = append([]byte(nil), data[cut+1:]...)
		if m := fatalConsole.Find(data[:cut]); m != nil {
			fatal(string(bytes.TrimSpace(m)))
			return
		}
	}
}

// lockPath is the machine-wide lock test hosts take (see lockMachine); waiters queue in lockPath+".queue".
var lockPath = filepath.Join(os.TempDir(), "cube-testhost.lock")

// lockMachine waits until no other test host runs on this machine and returns the unlock function. The lock
// is an flock (released when the process dies); waiters take turns in arrival order through a queue of
// tickets named by arrival time and pid, so a long queue does not starve one of them.
func lockMachine(ctx context.Context, logf func(string, ...any)) (func(), error) {
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("test host lock %s: %w", lockPath, err)
	}
	unlock := func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }
	queue := lockPath + ".queue"
	if err := os.MkdirAll(queue, 0o777); err != nil {
		f.Close()
		return nil, fmt.Errorf("test host lock queue: %w", err)
	}
	ticket := filepath.Join(queue, fmt.Sprintf("%020d-%d-%p", time.Now().UnixNano(), os.Getpid(), f))
	if err := os.WriteFile(ticket, nil, 0o666); err != nil {
		f.Close()
		return nil, fmt.Errorf("test host lock queue: %w", err)
	}
	defer os.Remove(ticket)
	start := time.Now()
	said := false
	for {
		if first(queue, ticket) && unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if said {
				logf("test host: lock acquired after %s", time.Since(start).Round(time.Second))
			}
			return unlock, nil
		}
		if !said {
			logf("test host: another test host runs on this machine; waiting for it (lock %s)", lockPath)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for test host lock %s: %w", lockPath, ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// first says whether ticket is the oldest ticket in queue whose process is alive (tickets of dead processes
// are removed on the way).
func first(queue, ticket string) bool {
	names, err := os.ReadDir(queue)
	if err != nil {
		return true // no queue to honour: fall back to the bare flock
	}
	for _, n := range names { // ReadDir sorts by name: by arrival time
		p := filepath.Join(queue, n.Name())
		if p == ticket {
			return true
		}
		var when, pid int64
		if _, err := fmt.Sscanf(n.Name(), "%d-%d-", &when, &pid); err != nil || pid <= 0 ||
			unix.Kill(int(pid), 0) == unix.ESRCH {
			os.Remove(p)
			continue
		}
		return false
	}
	return true
}

var qemuVersionRE = regexp.MustCompile(`QEMU emulator version (\d+)\.`)

// warnOldQEMU says loudly when QEMU predates 9: its emulation of nested AMD-V froze test hosts.
func warnOldQEMU(qemu string) {
	out, err := exec.Command(qemu, "--version").Output()
	if err != nil {
		return
	}
	m := qemuVersionRE.FindSubmatch(out)
	if m == nil {
		return
	}
	if v, _ := strconv.Atoi(string(m[1])); v < 9 {
		logrus.Warnf("test host: %s is QEMU %s; its TCG emulation of nested AMD-V is known to freeze test hosts "+
			"and crash nested guests. Install QEMU >= 9 (bash .ci/install.d/qemu.sh does, from bookworm-backports)",
			qemu, m[1])
	}
}

// oopsStart matches the first line of a kernel report (oops, BUG, double fault, lockup, stall, panic).
var oopsStart = regexp.MustCompile(`\] (BUG: |Oops: |general protection fault|traps: |double fault|` +
	`kernel stack overflow|watchdog: BUG|rcu: INFO: |Kernel panic - not syncing|WARNING: CPU: |` +
	`corrupted stack end)`)

// KernelReport returns up to n console lines from the first kernel report on: the start of a trace, which
// a console tail misses when the trace is long.
func KernelReport(console []byte, n int) string {
	loc := oopsStart.FindIndex(console)
	if loc == nil {
		return ""
	}
	start := bytes.LastIndexByte(console[:loc[0]], '\n') + 1
	lines := bytes.SplitAfter(console[start:], []byte("\n"))
	if len(lines) > n {
		lines = lines[:n]
	}
	return string(bytes.Join(lines, nil))
}
