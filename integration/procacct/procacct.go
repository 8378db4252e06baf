// Package procacct measures the test host's CPU by process name across a
// benchmark's step, short-lived processes included: the kernel's BSD
// process accounting (acct(2)) writes a record for every process that
// exits while it is on (a shim's start and delete, runc, a VMM), and the
// processes still running at the end (containerd, the snapshotter) are
// read from /proc. Linux's acct_v3 format, little-endian x86-64.
package procacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RecordSize is the size of one struct acct_v3.
const RecordSize = 64

// ahz is the kernel's unit for acct_v3 times (AHZ: 100 per second).
const ahz = 100

// Record is one exited process.
type Record struct {
	Comm         string // its name, at most 15 bytes (TASK_COMM_LEN)
	PID, PPID    uint32
	ExitCode     uint32
	User, System time.Duration // to 10 ms (AHZ)
}

// CPU is the record's user and system time.
func (r Record) CPU() time.Duration { return r.User + r.System }

// compT decodes a comp_t: a 13-bit mantissa and a 3-bit base-8 exponent.
func compT(c uint16) int64 { return int64(c&0x1fff) << (3 * (c >> 13)) }

// Parse decodes an accounting file of acct_v3 records. It refuses a size
// that is not whole records and a record of another version (the kernel
// was built with the v1 or v2 layout).
func Parse(data []byte) ([]Record, error) {
	if len(data)%RecordSize != 0 {
		return nil, fmt.Errorf("accounting file of %d bytes: not whole %d-byte acct_v3 records", len(data), RecordSize)
	}
	out := make([]Record, 0, len(data)/RecordSize)
	for off := 0; off < len(data); off += RecordSize {
		r := data[off : off+RecordSize]
		if v := r[1] & 0x0f; v != 3 {
			return nil, fmt.Errorf("accounting record %d has version %d, want 3 (acct_v3)", off/RecordSize, v)
		}
		le := binary.LittleEndian
		comm, _, _ := strings.Cut(string(r[48:64]), "\x00")
		out = append(out, Record{
			Comm:     comm,
			ExitCode: le.Uint32(r[4:]),
			PID:      le.Uint32(r[16:]),
			PPID:     le.Uint32(r[20:]),
			User:     time.Duration(compT(le.Uint16(r[32:]))) * (time.Second / ahz),
			System:   time.Duration(compT(le.Uint16(r[34:]))) * (time.Second / ahz),
		})
	}
	return out, nil
}

// Recorder is accounting switched on into a file of its own.
type Recorder struct {
	path string
	live map[int]proc
	idle time.Duration
}

// proc is a running process: its name and CPU so far.
type proc struct {
	comm string
	cpu  time.Duration
}

// Start switches accounting on into a new file in dir and notes the CPU
// of the processes running now. Only one Recorder may run at a time (the
// kernel has one accounting file).
func Start(dir string) (*Recorder, error) {
	f, err := os.CreateTemp(dir, "acct-*")
	if err != nil {
		return nil, err
	}
	f.Close()
	_, idle := HostCPU()
	r := &Recorder{path: f.Name(), live: running(), idle: idle}
	if err := unix.Acct(r.path); err != nil {
		os.Remove(r.path)
		return nil, fmt.Errorf("process accounting (acct) into %s: %w", r.path, err)
	}
	return r, nil
}

// Usage is the CPU of a Recorder's span.
type Usage struct {
	// ByName is the CPU by process name in the span: of the processes
	// that exited (less what one running at Start had used by then) and
	// the growth of those still running.
	ByName map[string]time.Duration
	// Idle is how long the host's CPUs were idle.
	Idle time.Duration
}

// Stop switches accounting off and returns the span's usage.
func (r *Recorder) Stop() (Usage, error) {
	offErr := acctOff()
	_, idle := HostCPU()
	idle -= r.idle
	now := running()
	data, err := os.ReadFile(r.path)
	os.Remove(r.path)
	if err := errors.Join(offErr, err); err != nil {
		return Usage{}, err
	}
	recs, err := Parse(data)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{ByName: map[string]time.Duration{}, Idle: idle}
	for _, rec := range recs {
		d := rec.CPU()
		if before, ok := r.live[int(rec.PID)]; ok && before.comm == rec.Comm {
			d -= before.cpu // it ran before Start: only its span counts
		}
		u.ByName[rec.Comm] += max(d, 0)
	}
	for pid, p := range now {
		if before, ok := r.live[pid]; ok && before.comm == p.comm {
			p.cpu -= before.cpu
		}
		u.ByName[p.comm] += max(p.cpu, 0)
	}
	return u, nil
}

// acctOff switches accounting off: acct(NULL) (unix.Acct("") passes an
// empty path, which fails with ENOENT and leaves it on).
func acctOff() error {
	if _, _, e := unix.Syscall(unix.SYS_ACCT, 0, 0, 0); e != 0 {
		return fmt.Errorf("switch process accounting off: %w", e)
	}
	return nil
}

// clockTick is USER_HZ, the unit of /proc's times (100 on Linux).
const clockTick = time.Second / 100

// running is every process running now by pid.
func running() map[int]proc {
	m := map[int]proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		if st, ok := ParseStat(string(b)); ok {
			m[pid] = proc{st.Comm, time.Duration(st.UTime+st.STime) * clockTick}
		}
	}
	return m
}

// Stat is what the benchmarks and tests read of a /proc/PID/stat (or
// /proc/PID/task/TID/stat) line. Times are in clock ticks.
type Stat struct {
	Comm, State  string
	PPID         string
	UTime, STime int
	// CUTime, CSTime: the waited-for children's.
	CUTime, CSTime int
}

// ParseStat parses a stat line ("pid (comm) S ppid … utime(14) stime(15)
// cutime(16) cstime(17)"): the name is between the first '(' and the last
// ')', as it may hold both, and spaces.
func ParseStat(line string) (Stat, bool) {
	i, j := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if i < 0 || j < i {
		return Stat{}, false
	}
	// After the name: state(0) ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime(11) stime(12) cutime cstime.
	f := strings.Fields(line[j+1:])
	if len(f) < 13 {
		return Stat{}, false
	}
	st := Stat{Comm: line[i+1 : j], State: f[0], PPID: f[1]}
	for k, p := range []*int{&st.UTime, &st.STime, &st.CUTime, &st.CSTime} {
		if 11+k >= len(f) {
			break
		}
		if _, err := fmt.Sscan(f[11+k], p); err != nil || *p < 0 {
			return Stat{}, false
		}
	}
	return st, true
}

// HostCPU is the host's CPU time so far, from /proc/stat's first line:
// busy (user, nice, system, irq, softirq, steal: a guest's time is in user
// already) and idle (idle, iowait). Zero when it cannot be read.
func HostCPU() (busy, idle time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal guest guest_nice
	for k := 1; k < len(f) && k <= 8; k++ {
		var v int64
		if _, err := fmt.Sscan(f[k], &v); err != nil {
			continue
		}
		if k == 4 || k == 5 {
			idle += time.Duration(v) * clockTick
		} else {
			busy += time.Duration(v) * clockTick
		}
	}
	return busy, idle
}
