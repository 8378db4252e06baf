package standby

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/procstat"
)

// TestStartTimeOfAZombie: an exited process not yet reaped (state Z in
// /proc/<pid>/stat; the parsing itself is shim/procstat's) has no start
// time: its standby is gone. A running one has the start time /proc says.
func TestStartTimeOfAZombie(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := procstat.Read(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.Exited() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit", pid)
		}
	}
	if _, err := StartTime(pid); !errdefs.IsNotFound(err) {
		t.Errorf("a zombie: %v, want NotFound", err)
	}
	if Alive(pid, 0) {
		t.Error("a zombie is alive")
	}
	self, err := procstat.Read(os.Getpid())
	if st, err2 := StartTime(os.Getpid()); err != nil || err2 != nil || st != self.Start || st == 0 {
		t.Errorf("this process: %d %v %v", st, err, err2)
	}
}

// sleeper starts a process that stands for a standby's VMM.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func publish(t *testing.T, stateDir, name, template string, pid int) string {
	t.Helper()
	dir := filepath.Join(stateDir, DirPrefix+name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, Record{Template: template, Pid: pid, StartTime: st, Slots: 8, Made: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestClaimOnceAndSweep(t *testing.T) {
	state := t.TempDir()
	a := sleeper(t)
	dirA := publish(t, state, "a", "/t/one/vm", a.Process.Pid)
	b := sleeper(t)
	dirB := publish(t, state, "b", "/t/two/vm", b.Process.Pid)
	// A record whose pid was reused: the start time does not match.
	reused := filepath.Join(state, DirPrefix+"reused")
	os.Mkdir(reused, 0o700)
	Write(reused, Record{Template: "/t/one/vm", Pid: os.Getpid(), StartTime: 1, Slots: 8})
	// A record that does not parse, and a directory being made (no record).
	junk := filepath.Join(state, DirPrefix+"junk")
	os.Mkdir(junk, 0o700)
	os.WriteFile(filepath.Join(junk, RecordName), []byte("{"), 0o600)
	making := filepath.Join(state, DirPrefix+"making")
	os.Mkdir(making, 0o700)
	// Not a standby at all.
	other := filepath.Join(state, "0123456789abcdef")
	os.Mkdir(other, 0o700)

	// Eight shims race for the one standby of /t/one/vm: one wins.
	var mu sync.Mutex
	var won []Standby
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, ok, err := Claim(state, "/t/one/vm")
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				won = append(won, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 || won[0].Dir != dirA || won[0].Record.Pid != a.Process.Pid || won[0].Record.Slots != 8 {
		t.Fatalf("claims won: %+v, want one of %s", won, dirA)
	}
	if _, err := os.Stat(filepath.Join(dirA, ClaimedName)); err != nil {
		t.Errorf("claimed record: %v", err)
	}
	for _, gone := range []string{reused, junk} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not swept: %v", gone, err)
		}
	}
	for _, kept := range []string{making, other, dirA, dirB} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
	if _, ok, _ := Claim(state, "/t/one/vm"); ok {
		t.Error("a claimed standby was claimed again")
	}

	// Its VMM dies: its record goes, and nothing is claimed.
	b.Process.Kill()
	b.Wait()
	if _, ok, _ := Claim(state, "/t/two/vm"); ok {
		t.Error("a standby whose VMM is gone was claimed")
	}
	if _, err := os.Stat(dirB); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead standby's dir not removed: %v", err)
	}
}

func TestStopKillsFreeStandbysOnly(t *testing.T) {
	state := t.TempDir()
	one, two, claimed := sleeper(t), sleeper(t), sleeper(t)
	publish(t, state, "one", "/t/one/vm", one.Process.Pid)
	dirTwo := publish(t, state, "two", "/t/two/vm", two.Process.Pid)
	dirC := publish(t, state, "c", "/t/one/vm", claimed.Process.Pid)
	if err := os.Rename(filepath.Join(dirC, RecordName), filepath.Join(dirC, ClaimedName)); err != nil {
		t.Fatal(err)
	}
	n, err := Stop(state, "/t/one/vm")
	if err != nil || n != 1 {
		t.Fatalf("Stop = %d, %v; want 1", n, err)
	}
	if err := one.Wait(); err == nil {
		t.Error("the free standby's VMM was not killed")
	}
	for _, c := range []*exec.Cmd{two, claimed} {
		if !Alive(c.Process.Pid, mustStart(t, c.Process.Pid)) {
			t.Errorf("pid %d (another template's, or adopted) was stopped", c.Process.Pid)
		}
	}
	if n, err := Stop(state, ""); err != nil || n != 1 {
		t.Errorf("Stop all = %d, %v; want 1", n, err)
	}
	if _, err := os.Stat(dirTwo); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stopped standby's dir left: %v", err)
	}
}

func mustStart(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestOpenRefusesAReusedPid(t *testing.T) {
	c := sleeper(t)
	st := mustStart(t, c.Process.Pid)
	if _, err := Open(c.Process.Pid, st+1); !errdefs.IsNotFound(err) {
		t.Errorf("Open with another start time: %v, want NotFound", err)
	}
	fd, err := Open(c.Process.Pid, st)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if err := Kill(c.Process.Pid, st+1); err != nil {
		t.Errorf("Kill of a reused pid: %v, want nothing done", err)
	}
	if !Alive(c.Process.Pid, st) {
		t.Fatal("Kill with a wrong start time signalled the process")
	}
}

func TestReadRecordRefusesNonsense(t *testing.T) {
	dir := t.TempDir()
	for i, body := range []string{`{}`, `{"template":"/t","pid":-1}`, `{"template":"","pid":5}`, `{"template":"/t","pid":5,"slots":65}`, `[`} {
		p := filepath.Join(dir, strconv.Itoa(i))
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := ReadRecord(p); !errdefs.IsDataLoss(err) {
			t.Errorf("%s: %v, want DataLoss", body, err)
		}
	}
}

// A process StartIdle starts runs at SCHED_IDLE (every thread), the caller
// stays at normal priority, and Normalize gives the process normal
// scheduling back.
func TestStartIdleAndNormalize(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	idle, err := StartIdle(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !idle {
		t.Fatal("SCHED_IDLE refused")
	}
	if p := policy(t, cmd.Process.Pid); p != unix.SCHED_IDLE {
		t.Errorf("child policy %d, want SCHED_IDLE", p)
	}
	if p := policy(t, unix.Gettid()); p != unix.SCHED_NORMAL {
		t.Errorf("the caller's thread kept policy %d", p)
	}
	if err := Normalize(cmd.Process.Pid); errors.Is(err, unix.EPERM) && os.Geteuid() != 0 {
		t.Skipf("not root: SCHED_IDLE → SCHED_NORMAL needs RLIMIT_NICE or CAP_SYS_NICE: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	if p := policy(t, cmd.Process.Pid); p != unix.SCHED_NORMAL {
		t.Errorf("after Normalize: policy %d", p)
	}
}

func policy(t *testing.T, tid int) uint32 {
	t.Helper()
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatal(err)
	}
	return a.Policy
}

// FuzzReadRecord: a record file of any content is read or refused, never
// accepted with a pid, template or slot count a claimer could not use.
func FuzzReadRecord(f *testing.F) {
	f.Add([]byte(`{"template":"/t/vm","pid":42,"start_time":7,"slots":8,"made":"2026-12-07T18:00:00Z"}`))
	f.Add([]byte(`{"template":"","pid":0}`))
	f.Add([]byte(`[1,2`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "r.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := ReadRecord(p)
		if err != nil {
			if !errdefs.IsDataLoss(err) {
				t.Fatalf("refused with %v, want DataLoss", err)
			}
			return
		}
		if r.Pid <= 0 || r.Template == "" || r.Slots < 0 || r.Slots > 64 {
			t.Fatalf("accepted %+v", r)
		}
	})
}
