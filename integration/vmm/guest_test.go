package vmm

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/vmmrun"
)

func guestArgs(scenario string, extra ...string) []string {
	return append([]string{"-kernel", guestKernel, "-initrd", devicesInitrd, "-memory", "256",
		"-cmdline", guestCmdline + " cube.scenario=" + scenario}, extra...)
}

// TestGuestDevices boots the Debian kernel with 2 vCPUs, two disks (rw and ro), virtio-rng and vsock, and
// checks from both sides: the guest sees 2 CPUs, reads the host's bytes, its writes reach the host file, the
// read-only disk refuses writes, the RNG gives bytes, vsock echoes a host-initiated connection and carries a
// guest-initiated one; then the guest powers off and cube-vmm exits 0.
func TestGuestDevices(t *testing.T) {
	dir := t.TempDir()
	rw := filepath.Join(dir, "rw.img")
	ro := filepath.Join(dir, "ro.img")
	must(t, os.WriteFile(rw, append([]byte("host-pattern-123"), make([]byte, 8<<20-16)...), 0o644))
	must(t, os.WriteFile(ro, append([]byte("read-only-d"), make([]byte, 1<<20-11)...), 0o644))
	uds := filepath.Join(dir, "vsock.sock")
	// The guest dials host port 6000: that is the Unix socket <uds>_6000, listening before the VM starts.
	ln, err := net.Listen("unix", uds+"_6000")
	must(t, err)
	defer ln.Close()
	fromGuest := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			fromGuest <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		b, _ := io.ReadAll(c)
		fromGuest <- string(b)
	}()

	r := vmmrun.Start(t, cubeVMM, guestArgs("devices", "-vcpus", "2",
		"-disk", rw+",serial=cube-rootfs-1", "-disk", ro+",ro", "-vsock", uds)...)
	r.WaitLine(t, "VSOCK_LISTENING=5000", 3*time.Minute)

	// Host-initiated: CONNECT to the guest's echo server on port 5000.
	c, err := net.Dial("unix", uds)
	must(t, err)
	c.SetDeadline(time.Now().Add(time.Minute))
	_, err = io.WriteString(c, "CONNECT 5000\n")
	must(t, err)
	br := bufio.NewReader(c)
	ack, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(ack, "OK ") {
		t.Fatalf("CONNECT 5000: answer %q, err %v", ack, err)
	}
	_, err = io.WriteString(c, "ping-from-host\n")
	must(t, err)
	echo, err := br.ReadString('\n')
	if err != nil || echo != "ping-from-host\n" {
		t.Fatalf("vsock echo = %q, err %v", echo, err)
	}
	c.(*net.UnixConn).CloseWrite()
	c.Close()

	select {
	case got := <-fromGuest:
		if got != "guest-to-host\n" {
			t.Errorf("guest-initiated vsock data = %q, want %q", got, "guest-to-host\n")
		}
	case <-time.After(2 * time.Minute):
		t.Errorf("no guest-initiated vsock connection; console:\n%s", r.ConsoleTail())
	}

	if st := r.Wait(t, 2*time.Minute); st != 0 {
		t.Fatalf("cube-vmm exit %d, want 0 (poweroff); stderr:\n%s\nconsole:\n%s", st, r.Stderr(), r.ConsoleTail())
	}
	want := map[string]string{
		"CPUS": "2", "SERIAL": "cube-rootfs-1", "READ": "host-pattern-123", "WRITE": "ok",
		"RO_WRITE": "refused", "RO_READ": "read-only-d", "RNG": "virtio_rng.0", "RNG_BYTES": "64", "VSOCK_DIAL": "ok",
	}
	for k, v := range want {
		if got := r.Result(k); got != v {
			t.Errorf("guest %s = %q, want %q", k, got, v)
		}
	}
	b, err := os.ReadFile(rw)
	must(t, err)
	if got := string(b[4096 : 4096+16]); got != "guest-wrote-this" {
		t.Errorf("host file at 4096 = %q, want the guest's write", got)
	}
	if b, _ := os.ReadFile(ro); string(b[:11]) != "read-only-d" {
		t.Errorf("read-only disk changed: %q", b[:11])
	}
	if t.Failed() {
		t.Logf("console:\n%s", r.ConsoleTail())
	}
}

// TestBadInvocations: usage errors exit 2 with a message naming the problem, before any VM is made.
func TestBadInvocations(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-kernel", "/nonexistent/vmlinuz"}, "kernel"},
		{[]string{}, "-kernel is required"},
		{[]string{"-kernel", guestKernel, "-memory", "1"}, "memory"},
		{[]string{"-kernel", guestKernel, "-disk", "/nonexistent.img"}, "disk 0"},
		{[]string{"-kernel", guestKernel, "-disk", "x.img,bogus"}, "unknown option"},
		{[]string{"-bogus"}, "bogus"},
		{[]string{"-kernel", guestKernel, "-vcpus", "0"}, "vCPUs"},
		{[]string{"-kernel", guestKernel, "-memory", "abc"}, "invalid value"},
		{[]string{"-kernel", guestKernel, "-net", "tap=cube-nosuch0"}, `tap "cube-nosuch0": no such interface`},
		{[]string{"-kernel", guestKernel, "-net", "tap=t0,mac=52:54:00:zz:00:01"}, "mac"},
		{[]string{"-kernel", guestKernel, "-net", "mac=52:54:00:12:00:01"}, "missing tap="},
	} {
		out, err := exec.CommandContext(context.Background(), cubeVMM, c.args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("cube-vmm %v: err %v, want exit 2; output:\n%s", c.args, err, out)
			continue
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("cube-vmm %v: output lacks %q:\n%s", c.args, c.want, out)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
