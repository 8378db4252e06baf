package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// BenchmarkCtrRunCPU: where the test host's CPU goes during `ctr run --rm …
// true`, for io.cube.v1 from a template and for runc, by process name. The
// test host has one vCPU, so a run's wall time is about the CPU work of
// every process on it: this says whose work the gap to runc is. Processes
// are sampled every 50 ms (a short-lived one is counted up to its last
// sample; the sampler's own cost shows as shim.test). Each
// variant runs -benchtime times after one untimed warm-up run; the table
// gives medians. Diagnostics: no pass/fail on the figures.
func BenchmarkCtrRunCPU(b *testing.B) {
	d := startDaemons(b)
	type result struct {
		wall time.Duration
		cpu  map[string]int64 // ms by process name; "busy": the whole test host
	}
	results := map[string][]result{}
	run := func(b *testing.B, name string, args []string) {
		// Warm-up: runc's snapshotter unpacks the image on first use.
		warm := append(append([]string{"run", "--rm"}, args...), cubetest.ImageRef, name+"-warm", "true")
		if out, rc, err := d.CtrQuiet(nil, warm...); err != nil || rc != 0 {
			d.Forget(name + "-warm")
			b.Fatalf("%s warm-up: rc %d %v\n%s", name, rc, err, out)
		}
		n := 0
		for b.Loop() {
			n++
			id := fmt.Sprintf("%s-cpu%d", name, n)
			s := startCPUSampler()
			start := time.Now()
			out, rc, err := d.CtrQuiet(nil, append(append([]string{"run", "--rm"}, args...), cubetest.ImageRef, id, "true")...)
			wall := time.Since(start)
			cpu := s.stop()
			if err != nil || rc != 0 {
				d.Forget(id)
				b.Fatalf("%s: rc %d %v\n%s", id, rc, err, out)
			}
			results[name] = append(results[name], result{wall, cpu})
		}
	}
	b.Run("cube-template", func(b *testing.B) { run(b, "cube-template", d.templateRuntime(b, benchloss.New(b))) })
	b.Run("runc", func(b *testing.B) { run(b, "runc", cubetest.RuncRuntime.Args) })

	names := map[string]bool{}
	for _, rs := range results {
		for _, r := range rs {
			for n := range r.cpu {
				names[n] = true
			}
		}
	}
	cols := slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if n != "busy" && !yield(n) {
				return
			}
		}
	})
	median := func(rs []result, f func(result) int64) int64 {
		v := make([]int64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Printf("\n`ctr run --rm … true`: test host CPU by process (ms, median of %d runs each)\n\n| process | cube-template | runc |\n|---|---|---|\n", len(results["runc"]))
	row := func(label string, f func(result) int64) {
		fmt.Printf("| %s |", label)
		for _, v := range []string{"cube-template", "runc"} {
			if rs := results[v]; len(rs) > 0 {
				fmt.Printf(" %d |", median(rs, f))
			} else {
				fmt.Printf(" – |")
			}
		}
		fmt.Println()
	}
	row("wall", func(r result) int64 { return r.wall.Milliseconds() })
	row("test host busy", func(r result) int64 { return r.cpu["busy"] })
	for _, n := range cols {
		row(n, func(r result) int64 { return r.cpu[n] })
	}
}

// cpuSampler follows every process's own CPU time (ms) from its start
// until stop.
type cpuSampler struct {
	base, last map[int]procCPU
	busy0      int64
	mu         sync.Mutex
	done, out  chan struct{}
}

type procCPU struct {
	name string
	ms   int64
}

func startCPUSampler() *cpuSampler {
	s := &cpuSampler{base: readProcCPU(), last: map[int]procCPU{}, busy0: busyMS(), done: make(chan struct{}), out: make(chan struct{})}
	go func() {
		defer close(s.out)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *cpuSampler) sample() {
	now := readProcCPU()
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, p := range now {
		if b, ok := s.base[pid]; ok && b.name != p.name {
			delete(s.base, pid) // the pid was reused (or the process exec'd): count it whole
		}
		s.last[pid] = p
	}
}

// stop ends the sampling and returns ms per process name since the start,
// and "busy": the whole test host's busy time.
func (s *cpuSampler) stop() map[string]int64 {
	close(s.done)
	<-s.out
	s.sample()
	m := map[string]int64{"busy": busyMS() - s.busy0}
	for pid, p := range s.last {
		if v := p.ms - s.base[pid].ms; v > 0 {
			m[p.name] += v
		}
	}
	return m
}

// readProcCPU reads every process's name (comm) and own CPU time (user and
// system, not its children's: they are sampled themselves) in ms.
func readProcCPU() map[int]procCPU {
	m := map[int]procCPU{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		st := string(b)
		i, j := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if i < 0 || j < i {
			continue
		}
		f := strings.Fields(st[j+1:])
		if len(f) < 15 {
			continue
		}
		var ticks int64
		for _, k := range f[11:13] {
			v, _ := strconv.ParseInt(k, 10, 64)
			ticks += v
		}
		m[pid] = procCPU{name: st[i+1 : j], ms: ticks * 10}
	}
	return m
}

// busyMS is the test host's busy CPU time (not idle, not iowait) in ms.
func busyMS() int64 { return cpuTicks()["busy"] * 10 }
