package stdio

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/fifo"
	"golang.org/x/sys/unix"
)

// socketPair returns two connected Unix stream sockets (they support CloseWrite).
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// clientFifos creates containerd-style fifos and opens the client's ends the
// way containerd's cio does (readers for output, a writer for stdin).
type clientFifos struct {
	cfg            Config
	stdin          io.WriteCloser
	stdout, stderr io.ReadCloser
}

func newClientFifos(t *testing.T, ctx context.Context, withStdin bool) *clientFifos {
	t.Helper()
	dir := t.TempDir()
	c := &clientFifos{cfg: Config{Stdout: filepath.Join(dir, "out"), Stderr: filepath.Join(dir, "err")}}
	var err error
	mode := syscall.O_RDONLY | syscall.O_CREAT | syscall.O_NONBLOCK
	if c.stdout, err = fifo.OpenFifo(ctx, c.cfg.Stdout, mode, 0o700); err != nil {
		t.Fatal(err)
	}
	if c.stderr, err = fifo.OpenFifo(ctx, c.cfg.Stderr, mode, 0o700); err != nil {
		t.Fatal(err)
	}
	if withStdin {
		c.cfg.Stdin = filepath.Join(dir, "in")
		if c.stdin, err = fifo.OpenFifo(ctx, c.cfg.Stdin, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, f := range []io.Closer{c.stdin, c.stdout, c.stderr} {
			if f != nil {
				f.Close()
			}
		}
	})
	return c
}

func TestFifoStdioRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := newClientFifos(t, ctx, true)
	hio, err := Open(ctx, "c1", "default", cl.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hio.Close()
	in, out, errw := cl.cfg.Wants()
	if !in || !out || !errw {
		t.Fatalf("wants %v %v %v", in, out, errw)
	}
	hostIn, guestIn := socketPair(t)
	hostOut, guestOut := socketPair(t)
	hostErr, guestErr := socketPair(t)
	hio.Attach(hostIn, hostOut, hostErr)

	// The "guest" echoes stdin to stdout upper-cased and writes a line to stderr.
	go func() {
		data, _ := io.ReadAll(guestIn)
		guestIn.Close() // as the agent does once stdin is passed on
		guestOut.Write(bytes.ToUpper(data))
		guestOut.Close()
		io.WriteString(guestErr, "warning\n")
		guestErr.Close()
	}()
	io.WriteString(cl.stdin, "hello through the fifo\n")
	cl.stdin.Close() // client EOF
	hio.CloseStdin()

	got, err := io.ReadAll(cl.stdout)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "HELLO THROUGH THE FIFO\n" {
		t.Fatalf("stdout %q", got)
	}
	gotErr, _ := io.ReadAll(cl.stderr)
	if string(gotErr) != "warning\n" {
		t.Fatalf("stderr %q", gotErr)
	}
	if err := hio.WaitOutput(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCloseStdinCutsAnOpenWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := newClientFifos(t, ctx, true)
	hio, err := Open(ctx, "c1", "default", cl.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hio.Close()
	hostIn, guestIn := socketPair(t)
	hio.Attach(hostIn, nil, nil)
	io.WriteString(cl.stdin, "abc")
	// The client keeps its write end open (CloseIO without closing the
	// fifo): CloseStdin still delivers EOF to the guest.
	got := make(chan string)
	go func() { b, _ := io.ReadAll(guestIn); got <- string(b) }()
	hio.CloseStdin()
	if s := <-got; s != "abc" {
		t.Fatalf("guest stdin %q", s)
	}
}

// TestCloseStdinWaitsForTheGuest: CloseStdin returns only once the guest has
// taken all of stdin and closed its end of the stream, so the agent's
// CloseStdin RPC that follows cannot overtake data still in flight.
func TestCloseStdinWaitsForTheGuest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := newClientFifos(t, ctx, true)
	hio, err := Open(ctx, "c1", "default", cl.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hio.Close()
	hostIn, guestIn := socketPair(t)
	hio.Attach(hostIn, nil, nil)
	took := make(chan string, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // an agent slow to forward stdin
		b, _ := io.ReadAll(guestIn)
		took <- string(b)
		guestIn.Close() // as the agent does once it has passed stdin on
	}()
	io.WriteString(cl.stdin, "through stdin\n")
	cl.stdin.Close()
	hio.CloseStdin()
	select {
	case s := <-took:
		if s != "through stdin\n" {
			t.Fatalf("guest stdin %q", s)
		}
	default:
		t.Fatal("CloseStdin returned before the guest had taken stdin and closed its end")
	}
	hio.CloseStdin() // again: no second wait, no panic
}

func TestTerminalHasNoStderr(t *testing.T) {
	c := Config{Stdin: "/a", Stdout: "/b", Stderr: "/c", Terminal: true}
	if _, _, e := c.Wants(); e {
		t.Fatal("terminal wants stderr")
	}
}

func TestFileURI(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "logs", "c.log")
	uri := "file://" + path
	hio, err := Open(ctx, "c1", "default", Config{Stdout: uri, Stderr: uri}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hostOut, guestOut := socketPair(t)
	hostErr, guestErr := socketPair(t)
	hio.Attach(nil, hostOut, hostErr)
	io.WriteString(guestOut, "out\n")
	guestOut.Close()
	io.WriteString(guestErr, "err\n")
	guestErr.Close()
	if err := hio.WaitOutput(ctx); err != nil {
		t.Fatal(err)
	}
	hio.Close()
	b, _ := os.ReadFile(path)
	// The two streams interleave by line in either order.
	if string(b) != "out\nerr\n" && string(b) != "err\nout\n" {
		t.Fatalf("file %q", b)
	}
}

// TestBinaryURI runs a real logging binary (sh) that copies fd 3 and fd 4 to a file.
func TestBinaryURI(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh in PATH for the logging binary")
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "logger")
	out := filepath.Join(dir, "log")
	os.WriteFile(script, []byte("#!"+sh+"\nexec 5>&-\ncat <&3 >>"+out+"\ncat <&4 >>"+out+"\necho \"$CONTAINER_NAMESPACE/$CONTAINER_ID\" >>"+out+"\n"), 0o755)
	ctx := context.Background()
	uri := "binary://" + script
	hio, err := Open(ctx, "c9", "ns1", Config{Stdout: uri, Stderr: uri}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hostOut, guestOut := socketPair(t)
	hostErr, guestErr := socketPair(t)
	hio.Attach(nil, hostOut, hostErr)
	io.WriteString(guestOut, "to stdout\n")
	guestOut.Close()
	io.WriteString(guestErr, "to stderr\n")
	guestErr.Close()
	if err := hio.WaitOutput(ctx); err != nil {
		t.Fatal(err)
	}
	hio.Close() // waits for the binary
	b, _ := os.ReadFile(out)
	if string(b) != "to stdout\nto stderr\nns1/c9\n" {
		t.Fatalf("logger wrote %q", b)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []Config{
		{Stdout: "ftp://x"},
		{Stdout: "binary:///nonexistent/logger"},
		{Stdout: "file:///proc/nope/x"},
	} {
		if _, err := Open(ctx, "c", "ns", c, nil); err == nil {
			t.Errorf("Open(%+v): want error", c)
		} else if c.Stdout == "ftp://x" && !strings.Contains(err.Error(), "unknown scheme") {
			t.Errorf("Open(%+v): %v", c, err)
		}
	}
}
