package testhost

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// fatalConsole matches test-host kernel messages after which the run cannot succeed: the kernel is stuck or
// dead. (An RCU stall alone can be transient under TCG, so only the self-detected form, which names a CPU
// stuck in the kernel, counts.)
var fatalConsole = regexp.MustCompile(`watchdog: BUG: soft lockup - CPU#\d+ stuck for \d+s!.*|` +
	`rcu: INFO: rcu_preempt self-detected stall on CPU|Kernel panic - not syncing:.*`)

// silentLimit is how long the console may go without a liveness line once the payload runs: stage 2 prints
// "cube-testhost: still running at …" every 60 s. A test host whose timer interrupt was lost (seen with one
// vCPU: docs/testhost.md) prints nothing more, ever, and would otherwise sit until the run's timeout. A
// variable so tests can shorten it.
var silentLimit = 4 * time.Minute

// aliveLine matches the console lines that show the test host's timers still fire: stage 2's start of the
// payload and its once-a-minute line.
var aliveLine = regexp.MustCompile(`cube-testhost: (payload starts at|still running at) `)

// watchConsole polls the console file and calls fatal once with the first matching line, or with a line of
// its own when the payload runs and the console shows no sign of life for silentLimit. It closes started (when
// not nil) once stage 2 says the payload starts. It stops when done is closed.
func watchConsole(path string, done <-chan struct{}, started chan<- struct{}, fatal func(line string)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var off int64
	var carry []byte
	var alive time.Time // the last liveness line seen (zero until the payload starts)
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if !alive.IsZero() && time.Since(alive) > silentLimit {
			fatal(fmt.Sprintf("cube-testhost: the console shows no sign of life for %s (no once-a-minute line): the test host's timer stopped", silentLimit))
			return
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
		if aliveLine.Match(data[:cut]) {
			if alive.IsZero() && started != nil {
				close(started)
			}
			alive = time.Now()
		}
	}
}

// lockPath is the machine-wide lock test hosts take (see lockMachine): one slot per core of the machine,
// slot 0 at lockPath and slot i at lockPath.i; waiters queue in lockPath+".queue".
var lockPath = filepath.Join(os.TempDir(), "cube-testhost.lock")

// machineSlots is how many test-host vCPUs the machine runs at once: one per core (TCG keeps a vCPU's core
// busy). A variable so tests can set it.
var machineSlots = runtime.NumCPU()

// lockMachine waits until the machine has a free core for each of the test host's vCPUs and returns the
// unlock function: a 2-vCPU test host on a 2-core machine runs alone, two 1-vCPU ones run side by side. Each
// core is an flock on its own file (released when the process dies); waiters take turns in arrival order
// through a queue of tickets named by arrival time and pid, so a long queue does not starve one of them.
func lockMachine(ctx context.Context, cpus int, logf func(string, ...any)) (func(), error) {
	slots := machineSlots
	if slots < 1 {
		slots = 1
	}
	need := min(max(cpus, 1), slots)
	queue := lockPath + ".queue"
	if err := os.MkdirAll(queue, 0o777); err != nil {
		return nil, fmt.Errorf("test host lock queue: %w", err)
	}
	ticket := filepath.Join(queue, fmt.Sprintf("%020d-%d-%d", time.Now().UnixNano(), os.Getpid(), ticketSeq.Add(1)))
	if err := os.WriteFile(ticket, nil, 0o666); err != nil {
		return nil, fmt.Errorf("test host lock queue: %w", err)
	}
	defer os.Remove(ticket)
	start := time.Now()
	said := false
	for {
		if first(queue, ticket) {
			held, err := takeSlots(slots, need)
			if err != nil {
				return nil, err
			}
			if held != nil {
				if said {
					logf("test host: lock acquired after %s", time.Since(start).Round(time.Second))
				}
				return func() { releaseSlots(held) }, nil
			}
		}
		if !said {
			logf("test host: other test hosts use this machine's cores; waiting for %d of %d (lock %s)", need, slots, lockPath)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for test host lock %s: %w", lockPath, ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
}

var ticketSeq atomic.Int64

// slotPath is the lock file of core slot i.
func slotPath(i int) string {
	if i == 0 {
		return lockPath
	}
	return fmt.Sprintf("%s.%d", lockPath, i)
}

// takeSlots flocks need of the slots lock files without waiting; it returns nil (holding none) when fewer are
// free.
func takeSlots(slots, need int) ([]*os.File, error) {
	var held []*os.File
	for i := 0; i < slots && len(held) < need; i++ {
		f, err := os.OpenFile(slotPath(i), os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			releaseSlots(held)
			return nil, fmt.Errorf("test host lock %s: %w", slotPath(i), err)
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			continue
		}
		held = append(held, f)
	}
	if len(held) < need {
		releaseSlots(held)
		return nil, nil
	}
	return held, nil
}

func releaseSlots(held []*os.File) {
	for _, f := range held {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
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
