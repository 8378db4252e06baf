package control

import (
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeVM struct {
	once    sync.Once
	mu      sync.Mutex
	state   string
	stopped chan struct{}
}

func (f *fakeVM) Pause() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == "stopped" {
		return errors.New("machine is stopped")
	}
	f.state = "paused"
	return nil
}
func (f *fakeVM) Resume() error { f.mu.Lock(); defer f.mu.Unlock(); f.state = "running"; return nil }
func (f *fakeVM) Stop() {
	f.mu.Lock()
	f.state = "stopped"
	f.mu.Unlock()
	f.once.Do(func() { close(f.stopped) })
}
func (f *fakeVM) InfoJSON() (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return json.Marshal(map[string]string{"state": f.state})
}

func TestControlRoundTrip(t *testing.T) {
	vm := &fakeVM{state: "running", stopped: make(chan struct{})}
	path := filepath.Join(t.TempDir(), "ctl.sock")
	s, err := Listen(path, vm)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := Dial(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var info struct{ State string }
	if err := c.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Info(t.Context(), &info); err != nil || info.State != "paused" {
		t.Fatalf("info %+v %v", info, err)
	}
	if err := c.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), Request{Op: "explode"}, nil); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("unknown op: %v", err)
	}
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stop not delivered")
	}
	if err := c.Pause(t.Context()); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("pause after stop: %v", err)
	}
}

// exitingVM is a VMM whose Stop ends it at once, as cube-vmm's does: its
// control server closes (dropping the connections) as soon as the VM stops.
type exitingVM struct {
	fakeVM
	srv chan *Server
}

func (e *exitingVM) Stop() { (<-e.srv).Close() }

// The stop reply must reach the client even when the VMM is gone right
// after (it used to be written after Stop began, and was lost as EOF).
func TestControlStopReplyBeforeExit(t *testing.T) {
	for i := range 50 {
		vm := &exitingVM{fakeVM: fakeVM{state: "running"}, srv: make(chan *Server, 1)}
		path := filepath.Join(t.TempDir(), "ctl.sock")
		s, err := Listen(path, vm)
		if err != nil {
			t.Fatal(err)
		}
		vm.srv <- s
		c, err := Dial(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(t.Context()); err != nil {
			t.Fatalf("stop %d: %v", i, err)
		}
		c.Close()
		s.Close()
	}
}

func TestControlBadInput(t *testing.T) {
	vm := &fakeVM{state: "running", stopped: make(chan struct{})}
	path := filepath.Join(t.TempDir(), "ctl.sock")
	s, err := Listen(path, vm)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("{not json\n"))
	var resp Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil || resp.OK || !strings.Contains(resp.Error, "bad request") {
		t.Errorf("garbage: %+v %v", resp, err)
	}
	conn2, _ := net.Dial("unix", path)
	defer conn2.Close()
	conn2.Write([]byte(strings.Repeat("x", 3*maxLine)))
	if err := json.NewDecoder(conn2).Decode(&resp); err != nil || resp.OK {
		t.Errorf("oversized: %+v %v", resp, err)
	}
}

func FuzzHandle(f *testing.F) {
	f.Add([]byte(`{"op":"info"}`))
	f.Add([]byte(`{"op":7}`))
	f.Add([]byte(`null`))
	s := &Server{target: &fakeVM{state: "running", stopped: make(chan struct{})}}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, _ := s.handle(line) // not run: a fuzzed stop must not stop anything
		if !r.OK && r.Error == "" {
			t.Fatalf("refusal without an error for %q", line)
		}
	})
}
