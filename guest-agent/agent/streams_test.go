package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"github.com/sirupsen/logrus"
)

// fakeStream is a stream connection whose writes can be made to fail (a
// connection the transport reset) and whose reads play a script.
type fakeStream struct {
	mu        sync.Mutex
	out       bytes.Buffer
	broken    bool
	closed    bool
	halfShut  bool
	reset     bool
	in        chan []byte // nil read: EOF
	closedCh  chan struct{}
	closeOnce sync.Once
}

func newFakeStream() *fakeStream {
	return &fakeStream{in: make(chan []byte, 8), closedCh: make(chan struct{})}
}

func (f *fakeStream) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken || f.closed {
		return 0, errors.New("fake stream: connection reset")
	}
	return f.out.Write(b)
}

func (f *fakeStream) Read(b []byte) (int, error) {
	select {
	case d, ok := <-f.in:
		if !ok || d == nil {
			return 0, io.EOF
		}
		return copy(b, d), nil
	case <-f.closedCh:
		return 0, errors.New("use of closed connection")
	}
}

func (f *fakeStream) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.closeOnce.Do(func() { close(f.closedCh) })
	return nil
}

func (f *fakeStream) CloseWrite() error {
	f.mu.Lock()
	f.halfShut = true
	f.mu.Unlock()
	return nil
}

func (f *fakeStream) TransportReset() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reset
}

func (f *fakeStream) written() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.String()
}

func (f *fakeStream) ended() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.halfShut
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func streamProcess(t *testing.T, want ...protocol.Stream) *process {
	p := &process{containerID: "c1", execID: "e1", wanted: map[protocol.Stream]bool{}, attached: map[protocol.Stream]*attachment{}}
	for _, s := range want {
		p.wanted[s] = true
	}
	t.Cleanup(func() {
		p.mu.Lock()
		p.closeStdio()
		p.mu.Unlock()
	})
	return p
}

// An output stream whose connection broke keeps what the process wrote and
// delivers it on the connection that re-attaches; EOF reaches the new one.
func TestOutputStreamReattaches(t *testing.T) {
	p := streamProcess(t, protocol.Stdout)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdoutR = r
	c1 := newFakeStream()
	if err := p.attach(protocol.Stdout, c1, false, quietLog()); err != nil {
		t.Fatal(err)
	}
	w.WriteString("before ")
	eventually(t, "output on the first connection", func() bool { return c1.written() == "OK\nbefore " })

	// A second connection without reattach is refused, as before.
	if err := p.attach(protocol.Stdout, newFakeStream(), false, quietLog()); err == nil {
		t.Fatal("a second stdout stream without reattach was accepted")
	}

	c1.mu.Lock()
	c1.broken = true // the transport reset
	c1.mu.Unlock()
	w.WriteString("after")
	time.Sleep(50 * time.Millisecond) // the pump reads and fails to write

	c2 := newFakeStream()
	if err := p.attach(protocol.Stdout, c2, true, quietLog()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the held output on the new connection", func() bool { return c2.written() == "OK\nafter" })
	c1.mu.Lock()
	replacedClosed := c1.closed
	c1.mu.Unlock()
	if !replacedClosed {
		t.Error("the replaced connection was not closed")
	}
	w.Close()
	eventually(t, "EOF on the new connection", c2.ended)
}

// Re-attaching a stream that was never attached attaches it.
func TestReattachWithoutEarlierStream(t *testing.T) {
	p := streamProcess(t, protocol.Stderr)
	r, w, _ := os.Pipe()
	defer w.Close()
	p.stderrR = r
	c := newFakeStream()
	if err := p.attach(protocol.Stderr, c, true, quietLog()); err != nil {
		t.Fatal(err)
	}
	w.WriteString("x")
	eventually(t, "output", func() bool { return c.written() == "OK\nx" })
	if err := p.attach(protocol.Stdout, newFakeStream(), true, quietLog()); err == nil {
		t.Fatal("re-attaching a stream the process was created without was accepted")
	}
}

// A stdin connection that ends in a transport reset leaves stdin open; the
// re-attached one's orderly close is EOF for the process.
func TestStdinSurvivesReset(t *testing.T) {
	p := streamProcess(t, protocol.Stdin)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p.stdinW = w
	c1 := newFakeStream()
	if err := p.attach(protocol.Stdin, c1, false, quietLog()); err != nil {
		t.Fatal(err)
	}
	c1.in <- []byte("one ")
	c1.mu.Lock()
	c1.reset = true
	c1.mu.Unlock()
	c1.in <- nil // the reset: reads end
	buf := make([]byte, 16)
	n, _ := io.ReadAtLeast(r, buf, 4)
	if string(buf[:n]) != "one " {
		t.Fatalf("stdin got %q", buf[:n])
	}
	eventually(t, "the reset connection closed", func() bool { c1.mu.Lock(); defer c1.mu.Unlock(); return c1.closed })
	p.mu.Lock()
	open := p.stdinW != nil
	p.mu.Unlock()
	if !open {
		t.Fatal("a reset stdin connection closed the process's stdin")
	}

	c2 := newFakeStream()
	if err := p.attach(protocol.Stdin, c2, true, quietLog()); err != nil {
		t.Fatal(err)
	}
	c2.in <- []byte("two")
	c2.in <- nil // orderly EOF
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "two" {
		t.Fatalf("stdin after re-attaching: %q, %v (want \"two\" then EOF)", rest, err)
	}
}

// Delete wakes an output pump waiting for a re-attachment.
func TestCloseStreamsEndsWaitingPump(t *testing.T) {
	p := streamProcess(t, protocol.Stdout)
	r, w, _ := os.Pipe()
	defer w.Close()
	p.stdoutR = r
	c := newFakeStream()
	c.broken = true
	if err := p.attach(protocol.Stdout, c, false, quietLog()); err == nil {
		t.Fatal("reply on a broken connection succeeded")
	}
	c = newFakeStream()
	if err := p.attach(protocol.Stdout, c, false, quietLog()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.broken = true
	c.mu.Unlock()
	w.WriteString("held")
	time.Sleep(20 * time.Millisecond)
	p.mu.Lock()
	p.closeStdio()
	p.mu.Unlock()
	if err := p.attach(protocol.Stdout, newFakeStream(), true, quietLog()); err == nil {
		t.Fatal("attached to a deleted process")
	}
}

func TestListProcesses(t *testing.T) {
	s := &Service{containers: map[string]*containerEntry{}}
	mk := func(cid, eid string, pid int, st procState) *process {
		return &process{containerID: cid, execID: eid, pid: pid, state: st,
			wanted: map[protocol.Stream]bool{protocol.Stdout: true}, attached: map[protocol.Stream]*attachment{}}
	}
	s.containers["b"] = &containerEntry{id: "b", init: mk("b", "", 20, stateRunning), execs: map[string]*process{}}
	s.containers["a"] = &containerEntry{id: "a", init: mk("a", "", 10, stateRunning), execs: map[string]*process{
		"z": mk("a", "z", 12, stateStopped), "w": mk("a", "w", 11, stateCreated)}}
	r, err := s.ListProcesses(context.Background(), &protocol.ListProcessesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Processes {
		got = append(got, p.ContainerId+"/"+p.ExecId+":"+p.Status)
		if !p.Stdio.Stdout || p.Stdio.Stdin {
			t.Errorf("%s/%s: stdio %v", p.ContainerId, p.ExecId, p.Stdio)
		}
	}
	want := []string{"a/:running", "a/w:created", "a/z:stopped", "b/:running"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	r, err = s.ListProcesses(context.Background(), &protocol.ListProcessesRequest{ContainerId: "b"})
	if err != nil || len(r.Processes) != 1 || r.Processes[0].Pid != 20 {
		t.Fatalf("container b: %v, %v", r, err)
	}
	if _, err := s.ListProcesses(context.Background(), &protocol.ListProcessesRequest{ContainerId: "nope"}); err == nil {
		t.Fatal("an unknown container was listed")
	}
}

func TestRenameContainer(t *testing.T) {
	s := &Service{containers: map[string]*containerEntry{}, log: logrus.StandardLogger()}
	mk := func(cid, eid string, pid int) *process {
		return &process{containerID: cid, execID: eid, pid: pid, state: stateRunning,
			wanted: map[protocol.Stream]bool{}, attached: map[protocol.Stream]*attachment{}}
	}
	s.containers["old"] = &containerEntry{id: "old", init: mk("old", "", 10), execs: map[string]*process{"w": mk("old", "w", 11)}}
	s.containers["other"] = &containerEntry{id: "other", init: mk("other", "", 20), execs: map[string]*process{}}
	ctx := context.Background()
	for _, bad := range []*protocol.RenameContainerRequest{
		{ContainerId: "missing", NewId: "x"}, {ContainerId: "old", NewId: "other"}, {ContainerId: "old", NewId: "-bad"}, {ContainerId: "", NewId: "x"},
	} {
		if _, err := s.RenameContainer(ctx, bad); err == nil {
			t.Errorf("rename %q to %q: no error", bad.ContainerId, bad.NewId)
		}
	}
	if _, err := s.RenameContainer(ctx, &protocol.RenameContainerRequest{ContainerId: "old", NewId: "new"}); err != nil {
		t.Fatal(err)
	}
	if _, p, err := s.lookup("new", "w"); err != nil || p.pid != 11 {
		t.Fatalf("exec w of the renamed container: %v %v", p, err)
	}
	if _, _, err := s.lookup("old", ""); err == nil {
		t.Error("the old id still answers")
	}
	r, err := s.ListProcesses(ctx, &protocol.ListProcessesRequest{ContainerId: "new"})
	if err != nil || len(r.Processes) != 2 || r.Processes[0].ContainerId != "new" || r.Processes[1].ContainerId != "new" || r.Processes[0].Pid != 10 {
		t.Fatalf("processes of the renamed container: %v %v", r, err)
	}
}
