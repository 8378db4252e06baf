package vmm

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	vnet "github.com/cube-runtime/cube/hypervisor/virtio/net"
	"github.com/cube-runtime/cube/hypervisor/virtio/net/taptest"
	"github.com/cube-runtime/cube/integration/vmmrun"
)

// bulkBytes is what the guest sends and receives in bulk: enough for TSO
// frames both ways (64 KiB writes out, the host's TCP stack batching in).
const bulkBytes = 64 * 65536

// TestGuestNet makes a tap in the test host with 10.0.2.2/24, boots the
// Debian guest with `-net tap=…,mac=…`, and from the guest (busybox `ip`,
// `ping`, `nc`, address 10.0.2.15): the interface has the configured MAC
// and negotiated the offloads, pings the test host, exchanges a line over
// TCP with a server here, and moves 4 MiB each way over TCP.
func TestGuestNet(t *testing.T) {
	tap := taptest.Make(t, "cubee", 0)
	if err := taptest.SetIPv4(tap, [4]byte{10, 0, 2, 2}, [4]byte{255, 255, 255, 0}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	serve(t, "10.0.2.2:7000", errs, func(c net.Conn) error { // a line each way
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "hello-from-guest\n" {
			return fmt.Errorf("port 7000: read %q, %v", line, err)
		}
		_, err = io.WriteString(c, "hello-from-host\n")
		return err
	})
	serve(t, "10.0.2.2:7001", errs, func(c net.Conn) error { // the guest sends bulkBytes, we say how many came
		n, err := io.CopyN(io.Discard, c, bulkBytes)
		fmt.Fprintf(c, "got-%d\n", n)
		return err
	})
	serve(t, "10.0.2.2:7002", errs, func(c net.Conn) error { // we send bulkBytes
		_, err := io.CopyN(c, zeros{}, bulkBytes)
		return err
	})

	const mac = "52:54:00:c0:be:01"
	r := vmmrun.Start(t, cubeVMM, guestArgs("net", "-net", "tap="+tap+",mac="+mac)...)
	if st := r.Wait(t, 5*time.Minute); st != 0 {
		t.Fatalf("cube-vmm exit %d, want 0 (poweroff); stderr:\n%s\nconsole:\n%s", st, r.Stderr(), r.ConsoleTail())
	}
	for i := 0; i < 3; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("a host server never finished its connection")
		}
	}
	want := map[string]string{
		"MAC": mac, "PING": "ok", "REPLY": "hello-from-host", "BULK_OUT": fmt.Sprintf("got-%d", bulkBytes),
		"BULK_IN": fmt.Sprint(bulkBytes), "RX_ERRORS": "0",
	}
	for k, v := range want {
		if got := r.Result(k); got != v {
			t.Errorf("guest %s = %q, want %q", k, got, v)
		}
	}
	// The guest driver took the offloads the tap agreed to (bit i of the
	// features string is feature bit i).
	feat := r.Result("FEATURES")
	for _, b := range []struct {
		name string
		bit  uint64
	}{{"CSUM", vnet.FCsum}, {"GUEST_CSUM", vnet.FGuestCsum}, {"MAC", vnet.FMAC}, {"HOST_TSO4", vnet.FHostTSO4},
		{"GUEST_TSO4", vnet.FGuestTSO4}, {"MRG_RXBUF", vnet.FMrgRxbuf}, {"STATUS", vnet.FStatus}} {
		i := 0
		for b.bit>>i != 1 {
			i++
		}
		if len(feat) <= i || feat[i] != '1' {
			t.Errorf("guest features %q: %s (bit %d) not negotiated", feat, b.name, i)
		}
	}
	if t.Failed() {
		t.Logf("console:\n%s\nstderr:\n%s", r.ConsoleTail(), r.Stderr())
	}
}

// serve accepts one connection on addr and runs handle on it; its error
// (or nil) goes to errs.
func serve(t *testing.T, addr string, errs chan<- error, handle func(net.Conn) error) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errs <- fmt.Errorf("accept %s: %v", addr, err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(4 * time.Minute))
		if err := handle(c); err != nil && !strings.Contains(err.Error(), "use of closed") {
			errs <- fmt.Errorf("%s: %v", addr, err)
			return
		}
		errs <- nil
	}()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
