package vmgenid

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// fakeMem is guest memory with a window at base.
type fakeMem struct {
	base uint64
	b    []byte
	log  *[]string
}

func (m *fakeMem) WriteAt(p []byte, gpa int64) (int, error) {
	off := uint64(gpa) - m.base
	if uint64(gpa) < m.base || off+uint64(len(p)) > uint64(len(m.b)) {
		return 0, fmt.Errorf("write at %#x outside guest memory", gpa)
	}
	*m.log = append(*m.log, fmt.Sprintf("write %x", p))
	return copy(m.b[off:], p), nil
}

const testAddr = 0xfe000

// newTest is a device over 64 bytes of guest memory around testAddr, its
// ids from rnd, logging writes and interrupts.
func newTest(t testing.TB, rnd []byte) (*Device, *fakeMem, *[]string) {
	t.Helper()
	var log []string
	mem := &fakeMem{base: testAddr - 16, b: make([]byte, 64), log: &log}
	d, err := New(Options{Mem: mem, Addr: testAddr, GSI: GSI, Rand: bytes.NewReader(rnd),
		Raise: func(gsi uint32) error { log = append(log, fmt.Sprintf("raise %d", gsi)); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	return d, mem, &log
}

func seq(from byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func TestGenerateWritesTheIDAndDoesNotNotify(t *testing.T) {
	d, mem, log := newTest(t, seq(1, 32))
	if d.ID() != [Size]byte{} {
		t.Fatalf("new device has id %x", d.ID())
	}
	if err := d.Generate(); err != nil {
		t.Fatal(err)
	}
	if got := mem.b[16:32]; !bytes.Equal(got, seq(1, 16)) {
		t.Errorf("guest memory at the id: %x, want %x", got, seq(1, 16))
	}
	if !bytes.Equal(mem.b[:16], make([]byte, 16)) || !bytes.Equal(mem.b[32:], make([]byte, 32)) {
		t.Errorf("write outside the id: %x", mem.b)
	}
	if id := d.ID(); !bytes.Equal(id[:], seq(1, 16)) || d.String() != fmt.Sprintf("%x", seq(1, 16)) {
		t.Errorf("ID %x String %s", id, d.String())
	}
	if strings.Join(*log, ";") != fmt.Sprintf("write %x", seq(1, 16)) {
		t.Errorf("log %q: Generate must write once and not notify", *log)
	}
}

// TestNewGeneration: a new id, written before the interrupt is raised.
func TestNewGeneration(t *testing.T) {
	d, mem, log := newTest(t, seq(1, 32))
	if err := d.Generate(); err != nil {
		t.Fatal(err)
	}
	*log = nil
	if err := d.NewGeneration(); err != nil {
		t.Fatal(err)
	}
	if got := mem.b[16:32]; !bytes.Equal(got, seq(17, 16)) {
		t.Errorf("guest memory %x, want the second id %x", got, seq(17, 16))
	}
	want := []string{fmt.Sprintf("write %x", seq(17, 16)), fmt.Sprintf("raise %d", GSI)}
	if strings.Join(*log, ";") != strings.Join(want, ";") {
		t.Errorf("log %q, want %q (id in memory, then the interrupt)", *log, want)
	}
}

func TestFailures(t *testing.T) {
	d, _, log := newTest(t, seq(1, 10)) // too few random bytes
	if err := d.NewGeneration(); err == nil || len(*log) != 0 {
		t.Errorf("short random source: %v, log %q", err, *log)
	}
	var l []string
	mem := &fakeMem{base: 0, b: make([]byte, 8), log: &l}
	d, err := New(Options{Mem: mem, Addr: testAddr, Raise: func(uint32) error { t.Error("raised after a failed write"); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.NewGeneration(); err == nil {
		t.Error("a write outside guest memory succeeded")
	}
	d, err = New(Options{Mem: &fakeMem{base: testAddr, b: make([]byte, 16), log: &l}, Addr: testAddr,
		Raise: func(uint32) error { return errors.New("no irqchip") }})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.NewGeneration(); err == nil || !strings.Contains(err.Error(), "no irqchip") {
		t.Errorf("failed interrupt: %v", err)
	}
	for _, o := range []Options{{}, {Mem: mem}, {Mem: mem, Raise: func(uint32) error { return nil }}, {Mem: mem, Addr: 3, Raise: func(uint32) error { return nil }}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
