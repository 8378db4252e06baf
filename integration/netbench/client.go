package netbench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Client drives one server.
type Client struct {
	Addr    string        // host:port
	Timeout time.Duration // bounds each operation, dial included
}

func (c Client) dial(cmd string) (net.Conn, *bufio.Reader, error) {
	conn, err := net.DialTimeout("tcp", c.Addr, c.Timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("netbench %s: %w", c.Addr, err)
	}
	conn.SetDeadline(time.Now().Add(c.Timeout))
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("netbench %s: %s: %w", c.Addr, cmd, err)
	}
	return conn, bufio.NewReader(conn), nil
}

// reply reads the server's one-line answer and fails unless it is want.
func reply(br *bufio.Reader, want string) error {
	line, err := br.ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer (%q so far): %w", line, err)
	}
	if got := strings.TrimSpace(line); got != want {
		return fmt.Errorf("server answered %q, want %q", got, want)
	}
	return nil
}

// Sink sends n bytes of the stream to the server and returns the time from the command to the server's
// answer that every byte arrived intact; any other answer fails.
func (c Client) Sink(n int64) (time.Duration, error) {
	start := time.Now()
	conn, br, err := c.dial(fmt.Sprintf("SINK %d", n))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err := writeStream(conn, n); err != nil {
		return 0, fmt.Errorf("netbench %s: SINK %d: %w", c.Addr, n, err)
	}
	if err := reply(br, fmt.Sprintf("OK %d", n)); err != nil {
		return 0, fmt.Errorf("netbench %s: SINK %d: %w", c.Addr, n, err)
	}
	return time.Since(start), nil
}

// Source has the server send n bytes of the stream, checks every byte and that exactly n came, and returns
// the time from the command to the server's close.
func (c Client) Source(n int64) (time.Duration, error) {
	start := time.Now()
	conn, br, err := c.dial(fmt.Sprintf("SOURCE %d", n))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err := readStream(br, n); err != nil {
		return 0, fmt.Errorf("netbench %s: SOURCE %d: %w", c.Addr, n, err)
	}
	// Ordering: the server closes after the last byte; anything more is a longer stream than asked.
	if m, _ := io.Copy(io.Discard, br); m > 0 {
		return 0, fmt.Errorf("netbench %s: SOURCE %d: %d bytes more than asked", c.Addr, n, m)
	}
	return time.Since(start), nil
}

// Echo makes count round trips of size-byte messages over one connection and returns each one's time; a
// message that does not come back as sent fails.
func (c Client) Echo(size, count int) ([]time.Duration, error) {
	conn, br, err := c.dial(fmt.Sprintf("ECHO %d", size))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	msg, back := make([]byte, size), make([]byte, size)
	rtts := make([]time.Duration, 0, count)
	for i := range count {
		Fill(int64(i)*int64(size), msg)
		t := time.Now()
		if _, err := conn.Write(msg); err != nil {
			return nil, fmt.Errorf("netbench %s: echo %d: %w", c.Addr, i, err)
		}
		if _, err := io.ReadFull(br, back); err != nil {
			return nil, fmt.Errorf("netbench %s: echo %d: %w", c.Addr, i, err)
		}
		rtts = append(rtts, time.Since(t))
		if !bytes.Equal(msg, back) {
			return nil, fmt.Errorf("netbench %s: echo %d came back altered", c.Addr, i)
		}
	}
	return rtts, nil
}

// Quit ends the server's Serve.
func (c Client) Quit() error {
	conn, br, err := c.dial("QUIT")
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := reply(br, "BYE"); err != nil {
		return fmt.Errorf("netbench %s: QUIT: %w", c.Addr, err)
	}
	return nil
}

// WaitReady dials until the server accepts (it may still be booting) or timeout passes; stop, if it
// returns an error, ends the wait early with it (the server's VM or container is gone).
func (c Client) WaitReady(timeout time.Duration, stop func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", c.Addr, time.Second)
		if err == nil {
			conn.Close() // the server logs the empty command and goes on
			return nil
		}
		if stop != nil {
			if serr := stop(); serr != nil {
				return serr
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netbench %s: no server within %v: %w", c.Addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
