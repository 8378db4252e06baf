package procacct

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// record builds one acct_v3 record.
func record(comm string, pid, ppid uint32, utime, stime uint16) []byte {
	r := make([]byte, RecordSize)
	r[1] = 3
	le := binary.LittleEndian
	le.PutUint32(r[4:], 7)
	le.PutUint32(r[16:], pid)
	le.PutUint32(r[20:], ppid)
	le.PutUint16(r[32:], utime)
	le.PutUint16(r[34:], stime)
	copy(r[48:], comm)
	return r
}

func TestParse(t *testing.T) {
	// 0x2001: mantissa 1, exponent 1 → 8 ticks of 10 ms.
	data := append(record("containerd-shim", 10, 1, 25, 0x2001), record("true", 11, 10, 0, 0)...)
	recs, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Comm: "containerd-shim", PID: 10, PPID: 1, ExitCode: 7, User: 250 * time.Millisecond, System: 80 * time.Millisecond},
		{Comm: "true", PID: 11, PPID: 10, ExitCode: 7},
	}
	if len(recs) != 2 || recs[0] != want[0] || recs[1] != want[1] {
		t.Fatalf("parsed %+v, want %+v", recs, want)
	}
	if recs[0].CPU() != 330*time.Millisecond {
		t.Errorf("CPU %v, want 330ms", recs[0].CPU())
	}
	if _, err := Parse(data[:RecordSize+1]); err == nil || !strings.Contains(err.Error(), "whole") {
		t.Errorf("a torn record: %v, want a refusal", err)
	}
	v2 := record("x", 1, 1, 0, 0)
	v2[1] = 2
	if _, err := Parse(v2); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("a v2 record: %v, want a refusal naming the version", err)
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 31 7 2 3 20 0 1 0 5 1000 10\n"
	st, ok := ParseStat(line)
	want := Stat{Comm: "a (weird) name", State: "S", PPID: "1", UTime: 31, STime: 7, CUTime: 2, CSTime: 3}
	if !ok || st != want {
		t.Fatalf("ParseStat: %+v %v, want %+v", st, ok, want)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 -3 1", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 3 y"} {
		if _, ok := ParseStat(bad); ok {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

// TestRecorder: a process started and ended between Start and Stop is in
// the usage by its name, and the recorder's file is gone. Needs root
// (CAP_SYS_PACCT); skipped otherwise.
func TestRecorder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("acct(2) needs root")
	}
	r, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A busy loop long enough to be accounted (10 ms units).
	if out, err := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done").CombinedOutput(); err != nil {
		r.Stop()
		t.Fatalf("sh: %v %s", err, out)
	}
	u, err := r.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if u.ByName["sh"] <= 0 {
		t.Fatalf("no CPU for sh in %v", u.ByName)
	}
	if _, err := os.Stat(r.path); !os.IsNotExist(err) {
		t.Errorf("accounting file %s left behind: %v", r.path, err)
	}
}

// TestRecorderCountsOnlyTheSpan: a process that used CPU before Start and
// exits before Stop counts only what it used in between (its accounting
// record has its whole life). Needs root; skipped otherwise.
func TestRecorderCountsOnlyTheSpan(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("acct(2) needs root")
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	// A name of its own: other tests' shells may run meanwhile.
	burn := filepath.Join(t.TempDir(), "zzburn")
	if b, err := os.ReadFile(sh); err != nil || os.WriteFile(burn, b, 0o755) != nil {
		t.Fatalf("copy %s: %v", sh, err)
	}
	cmd := exec.Command(burn, "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until it has burnt its CPU and sleeps.
	var before time.Duration
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if st, ok := ParseStat(string(b)); ok && st.State == "S" && st.UTime+st.STime >= 5 {
			before = time.Duration(st.UTime+st.STime) * clockTick
			break
		}
		if time.Now().After(end) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the burner never settled into its sleep")
		}
	}
	r, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	u, err := r.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if got := u.ByName["zzburn"]; got > before/2 {
		t.Fatalf("zzburn: %v in the span, but it used %v before Start and then slept", got, before)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(record("ctr", 1, 1, 3, 4))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := Parse(data)
		if err == nil && len(recs) != len(data)/RecordSize {
			t.Fatalf("%d records from %d bytes", len(recs), len(data))
		}
		for _, r := range recs {
			if r.User < 0 || r.System < 0 || len(r.Comm) > 16 {
				t.Fatalf("bad record %+v", r)
			}
		}
	})
}

func FuzzParseStat(f *testing.F) {
	f.Add("1 (x) S 1 1 1 0 -1 0 0 0 0 0 3 4 0 0")
	f.Fuzz(func(t *testing.T, line string) {
		st, ok := ParseStat(line)
		if ok && (st.UTime < 0 || st.STime < 0 || st.CUTime < 0 || st.CSTime < 0 || !strings.Contains(line, "("+st.Comm+")")) {
			t.Fatalf("ParseStat(%q) = %+v", line, st)
		}
	})
}

// HostCPU reads this host's /proc/stat: something has run, and time moves on.
func TestHostCPU(t *testing.T) {
	busy, idle := HostCPU()
	if busy <= 0 || idle < 0 {
		t.Fatalf("HostCPU: busy %v, idle %v", busy, idle)
	}
	for end := time.Now().Add(10 * time.Second); ; {
		b2, i2 := HostCPU()
		if b2+i2 > busy+idle {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("HostCPU did not move in 10 s: %v %v", b2, i2)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
