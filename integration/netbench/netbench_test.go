package netbench

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestFillCheck(t *testing.T) {
	const n = 3*blockSize + 123
	whole := make([]byte, n)
	Fill(0, whole)
	if bad := Check(0, whole); bad != -1 {
		t.Fatalf("Check of a filled stream: byte %d differs", bad)
	}
	// Any piece filled at its own offset is the same bytes as the whole stream's.
	for _, r := range [][2]int{{0, 1}, {3, 9}, {blockSize - 5, blockSize + 20}, {2*blockSize + 7, n}} {
		p := make([]byte, r[1]-r[0])
		Fill(int64(r[0]), p)
		if string(p) != string(whole[r[0]:r[1]]) {
			t.Errorf("Fill(%d, %d bytes) differs from the stream", r[0], len(p))
		}
		if bad := Check(int64(r[0]), whole[r[0]:r[1]]); bad != -1 {
			t.Errorf("Check(%d, %d bytes): byte %d differs", r[0], r[1]-r[0], bad)
		}
	}
	// A flipped byte, in a block's index or in its body, is found at its offset.
	for _, at := range []int{0, 7, 8, blockSize + 3, 2*blockSize + 100} {
		c := append([]byte(nil), whole...)
		c[at] ^= 0x40
		if bad := Check(0, c); bad != int64(at) {
			t.Errorf("flipped byte %d: Check = %d", at, bad)
		}
	}
	// A block sent twice (the second copy where the next belongs) is found at the next block's start.
	dup := append(append([]byte(nil), whole[:blockSize]...), whole[:blockSize]...)
	if bad := Check(0, dup); bad != blockSize {
		t.Errorf("repeated block: Check = %d, want %d", bad, blockSize)
	}
}

func startServer(t *testing.T) (Client, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan error, 1)
	go func() { done <- Serve(ln, t.Logf) }()
	return Client{Addr: ln.Addr().String(), Timeout: 30 * time.Second}, done
}

func TestServe(t *testing.T) {
	c, done := startServer(t)
	if err := c.WaitReady(10*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{1, 1000, 5*blockSize + 17, 3 << 20} {
		if _, err := c.Sink(n); err != nil {
			t.Errorf("Sink(%d): %v", n, err)
		}
		if _, err := c.Source(n); err != nil {
			t.Errorf("Source(%d): %v", n, err)
		}
	}
	rtts, err := c.Echo(64, 100)
	if err != nil || len(rtts) != 100 {
		t.Errorf("Echo: %d round trips, %v", len(rtts), err)
	}
	if err := c.Quit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != ErrQuit {
			t.Errorf("Serve after QUIT = %v, want ErrQuit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after QUIT")
	}
}

// raw sends cmd and data on one connection and returns the server's answer line.
func raw(t *testing.T, c Client, cmd string, data []byte, closeWrite bool) string {
	t.Helper()
	conn, err := net.Dial("tcp", c.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s\n", cmd)
	conn.Write(data)
	if closeWrite {
		conn.(*net.TCPConn).CloseWrite()
	}
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line)
}

// TestServeRefuses: a corrupt or short SINK and a bad command are answered BAD, and the server goes on.
func TestServeRefuses(t *testing.T) {
	c, _ := startServer(t)
	good := make([]byte, 2*blockSize)
	Fill(0, good)
	bad := append([]byte(nil), good...)
	bad[blockSize+9] ^= 1
	if got := raw(t, c, fmt.Sprintf("SINK %d", len(bad)), bad, false); !strings.HasPrefix(got, "BAD corrupt stream: byte 65545") {
		t.Errorf("corrupt SINK answered %q", got)
	}
	if got := raw(t, c, fmt.Sprintf("SINK %d", len(good)+1), good, true); !strings.HasPrefix(got, "BAD short stream: 131072 of 131073") {
		t.Errorf("short SINK answered %q", got)
	}
	for _, cmd := range []string{"NOPE 1", "SINK x", "SINK 0", "SINK -5", "ECHO 70000", "SOURCE 99999999999999"} {
		if got := raw(t, c, cmd, nil, false); !strings.HasPrefix(got, "BAD ") {
			t.Errorf("%q answered %q, want BAD …", cmd, got)
		}
	}
	if _, err := c.Sink(1000); err != nil {
		t.Errorf("after the refusals: %v", err)
	}
}

// TestSourceChecked: the client refuses a stream that is short, corrupt or longer than asked.
func TestSourceChecked(t *testing.T) {
	for name, send := range map[string]func(net.Conn){
		"short":   func(c net.Conn) { writeStream(c, 999) },
		"long":    func(c net.Conn) { writeStream(c, 1001) },
		"corrupt": func(c net.Conn) { p := make([]byte, 1000); Fill(0, p); p[500]++; c.Write(p) },
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadString('\n')
			send(c)
			c.Close()
		}()
		if _, err := (Client{Addr: ln.Addr().String(), Timeout: 10 * time.Second}).Source(1000); err == nil {
			t.Errorf("%s stream accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		ln.Close()
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"SINK 100\n", "SOURCE 1", "ECHO 64", "QUIT", "ECHO 65537", "SINK -1", "X 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		verb, n, err := parseCommand(line)
		if err != nil {
			return
		}
		switch {
		case verb == "QUIT":
		case n < 1 || n > MaxBytes || verb == "ECHO" && n > MaxMessage:
			t.Fatalf("%q: accepted size %d", line, n)
		}
	})
}
