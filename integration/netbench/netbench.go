// Package netbench measures TCP between two ends: bulk throughput each way with every byte checked, and the
// round-trip time of small requests. One end serves (Serve: the guest of a VM, or a process in a container);
// the other drives (Sink, Source, Echo, Quit: the benchmark in the test host). integration/vmm's net benchmark
// runs the same server behind cube-vmm's virtio-net, QEMU's and a runc container's veth.
//
// The wire protocol is one command line per connection, then its data:
//
//	SINK n      the client sends n bytes of the stream; the server checks them and answers "OK n" or
//	            "BAD <what>" (first wrong offset, or a short count)
//	SOURCE n    the server sends n bytes of the stream and closes; the client checks them
//	ECHO size   the client sends size-byte messages, the server writes each back, until EOF
//	QUIT        the server answers "BYE" and Serve returns
//
// The stream is a fixed pseudo-random 64 KiB block repeated, each copy's first 8 bytes XORed with its
// index, so a lost, repeated, reordered or altered block is found by its offset; checking costs a memcmp,
// the same at both ends and in every configuration compared.
package netbench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// Port is where the benchmark's servers listen.
const Port = 7100

const (
	blockShift = 16
	blockSize  = 1 << blockShift
	// bufSize is each end's read and write size.
	bufSize = 256 << 10
	// MaxMessage bounds an ECHO message and MaxBytes a SINK or SOURCE (untrusted command lines).
	MaxMessage = 64 << 10
	MaxBytes   = 1 << 40
)

// block is the stream's repeated 64 KiB (xorshift64 from a fixed seed).
var block = func() []byte {
	b := make([]byte, blockSize)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < blockSize; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
}()

// Fill writes the stream's bytes at offsets off … off+len(p)-1 into p.
func Fill(off int64, p []byte) {
	for len(p) > 0 {
		k, j := off>>blockShift, int(off&(blockSize-1))
		n := copy(p, block[j:])
		for i := j; i < 8 && i-j < n; i++ {
			p[i-j] ^= byte(uint64(k) >> (8 * i))
		}
		p, off = p[n:], off+int64(n)
	}
}

// Check returns the offset of the first byte of p that is not the stream's at off, or -1.
func Check(off int64, p []byte) int64 {
	for len(p) > 0 {
		k, j := off>>blockShift, int(off&(blockSize-1))
		n := min(len(p), blockSize-j)
		h := 0
		for i := j; i < 8 && i-j < n; i++ {
			if p[i-j] != block[i]^byte(uint64(k)>>(8*i)) {
				return off + int64(i-j)
			}
			h++
		}
		if !bytes.Equal(p[h:n], block[j+h:j+n]) {
			for i := h; i < n; i++ {
				if p[i] != block[j+i] {
					return off + int64(i)
				}
			}
		}
		p, off = p[n:], off+int64(n)
	}
	return -1
}

// writeStream sends n bytes of the stream to w.
func writeStream(w io.Writer, n int64) error {
	buf := make([]byte, bufSize)
	for off := int64(0); off < n; {
		p := buf[:min(int64(len(buf)), n-off)]
		Fill(off, p)
		if _, err := w.Write(p); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, n, err)
		}
		off += int64(len(p))
	}
	return nil
}

// readStream reads the stream from r until EOF or want bytes and checks every byte: it fails on the first
// wrong one, on fewer than want or on more.
func readStream(r io.Reader, want int64) error {
	buf := make([]byte, bufSize)
	var off int64
	for off < want {
		n, err := r.Read(buf[:min(int64(len(buf)), want-off)])
		if bad := Check(off, buf[:n]); bad >= 0 {
			return fmt.Errorf("corrupt stream: byte %d differs", bad)
		}
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, want, err)
		}
	}
	if off != want {
		return fmt.Errorf("short stream: %d of %d bytes", off, want)
	}
	return nil
}

// parseCommand splits a command line ("SINK 1024") and bounds its number.
func parseCommand(line string) (string, int64, error) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch verb {
	case "QUIT":
		return verb, 0, nil
	case "SINK", "SOURCE", "ECHO":
	default:
		return "", 0, fmt.Errorf("unknown command %q", verb)
	}
	n, err := strconv.ParseInt(arg, 10, 64)
	switch {
	case err != nil:
		return "", 0, fmt.Errorf("%s: size %q: %v", verb, arg, err)
	case n < 1, verb == "ECHO" && n > MaxMessage, n > MaxBytes:
		return "", 0, fmt.Errorf("%s: size %d out of range", verb, n)
	}
	return verb, n, nil
}

// ErrQuit is what Serve returns after a QUIT.
var ErrQuit = errors.New("netbench: quit")

// Serve answers connections on ln one at a time until QUIT (then ErrQuit) or an accept fails. A
// connection's failure is logged with logf and ends only that connection.
func Serve(ln net.Listener, logf func(format string, args ...any)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		quit, err := serveConn(c)
		c.Close()
		if err != nil {
			logf("netbench: %s: %v", c.RemoteAddr(), err)
		}
		if quit {
			return ErrQuit
		}
	}
}

func serveConn(c net.Conn) (quit bool, err error) {
	br := bufio.NewReaderSize(c, bufSize)
	line, err := br.ReadString('\n')
	if err == io.EOF && line == "" {
		return false, nil // a client's readiness probe (WaitReady)
	}
	if err != nil {
		return false, fmt.Errorf("command: %w", err)
	}
	verb, n, err := parseCommand(line)
	if err != nil {
		fmt.Fprintf(c, "BAD %v\n", err)
		return false, err
	}
	switch verb {
	case "QUIT":
		_, err = io.WriteString(c, "BYE\n")
		return true, err
	case "SINK":
		if err := readStream(br, n); err != nil {
			fmt.Fprintf(c, "BAD %v\n", err)
			return false, err
		}
		_, err = fmt.Fprintf(c, "OK %d\n", n)
		return false, err
	case "SOURCE":
		return false, writeStream(c, n)
	default: // ECHO
		msg := make([]byte, n)
		for {
			if _, err := io.ReadFull(br, msg); err != nil {
				if err == io.EOF {
					return false, nil
				}
				return false, err
			}
			if _, err := c.Write(msg); err != nil {
				return false, err
			}
		}
	}
}
