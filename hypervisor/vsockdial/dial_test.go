package vsockdial

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseReply(t *testing.T) {
	if p, err := ParseReply("OK 1073741824"); err != nil || p != 1073741824 {
		t.Fatalf("ParseReply = %d, %v", p, err)
	}
	for _, bad := range []string{"", "OK", "OK x", "OK 99999999999", "ERR no listener", strings.Repeat("x", 200)} {
		if _, err := ParseReply(bad); err == nil {
			t.Errorf("ParseReply(%q) accepted", bad)
		}
	}
}

// fakeDevice answers one handshake the way the device does (or with reply) and then echoes.
func fakeDevice(t *testing.T, reply string) string {
	uds := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "CONNECT 1024\n" {
			return
		}
		io.WriteString(c, reply+"early-guest-bytes")
		io.Copy(c, c)
	}()
	return uds
}

func TestDialKeepsBytesAfterReply(t *testing.T) {
	uds := fakeDevice(t, "OK 5\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, uds, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, len("early-guest-bytes"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "early-guest-bytes" {
		t.Fatalf("stream after handshake = %q, %v", buf, err)
	}
}

func TestDialRejectsOverlongReply(t *testing.T) {
	uds := fakeDevice(t, strings.Repeat("x", 200))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Dial(ctx, uds, 1024); err == nil || !strings.Contains(err.Error(), "longer") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParseReply(f *testing.F) {
	for _, s := range []string{"OK 1", "OK 4294967295", "OK 4294967296", "ERR x", "OK ", "OK -1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseReply(s)
		if err == nil && !strings.HasPrefix(s, "OK ") {
			t.Fatalf("accepted %q as port %d", s, p)
		}
	})
}

// BenchmarkDial: one Unix connect plus the CONNECT/OK handshake (what each agent and stdio stream connection
// costs on the host side).
func BenchmarkDial(b *testing.B) {
	uds := filepath.Join(b.TempDir(), "v.sock")
	ln, err := net.Listen("unix", uds)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					io.WriteString(c, "OK 1\n")
				}
			}()
		}
	}()
	for i := 0; i < b.N; i++ {
		c, err := Dial(context.Background(), uds, 1024)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func TestDialRefused(t *testing.T) {
	uds := fakeDevice(t, "ERR nobody listens\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Dial(ctx, uds, 1024); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "none.sock"), 1024); err == nil {
		t.Fatal("dial of a missing socket succeeded")
	}
}

func TestDialHonoursContext(t *testing.T) {
	uds := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(5 * time.Second) // never answers
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, uds, 1024); err == nil {
		t.Fatal("handshake with a silent device succeeded")
	}
}
