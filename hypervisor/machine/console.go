package machine

import (
	"bytes"
	"io"
	"sync"
)

// Markers the Linux kernel prints on panic. The first starts the trace;
// the second ends it (then the kernel halts or, with panic=N, reboots).
var (
	panicStart = []byte("Kernel panic - not syncing")
	panicEnd   = []byte("---[ end Kernel panic")
)

// console forwards the guest's serial output to the user's writer, keeps
// the last tailSize bytes for error reports, and watches for a kernel panic.
type console struct {
	out io.Writer

	mu      sync.Mutex
	tail    []byte
	line    []byte // current partial line, for marker matching
	paniced bool
	onPanic func(done bool) // done: the whole trace has been printed
}

const (
	tailSize = 16 << 10
	lineMax  = 4 << 10
)

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*tailSize {
		c.tail = append([]byte(nil), c.tail[len(c.tail)-tailSize:]...)
	}
	var events []bool
	for _, b := range p {
		if b != '\n' {
			if len(c.line) < lineMax {
				c.line = append(c.line, b)
			}
			continue
		}
		switch {
		case bytes.Contains(c.line, panicEnd):
			events = append(events, true)
		case !c.paniced && bytes.Contains(c.line, panicStart):
			c.paniced = true
			events = append(events, false)
		}
		c.line = c.line[:0]
	}
	cb := c.onPanic
	c.mu.Unlock()
	for _, done := range events {
		if cb != nil {
			cb(done)
		}
	}
	// The user's console failing must not stop the guest.
	if c.out != nil {
		c.out.Write(p)
	}
	return len(p), nil
}

// Tail returns the last lines of console output.
func (c *console) Tail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tail
	if len(t) > tailSize {
		t = t[len(t)-tailSize:]
	}
	return string(t)
}

// Panicked reports whether a kernel panic was seen.
func (c *console) Panicked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paniced
}
