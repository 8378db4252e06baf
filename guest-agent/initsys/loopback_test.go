package initsys

import (
	"os"
	"runtime"
	"testing"

	"github.com/cube-runtime/cube/guest-agent/netif"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"golang.org/x/sys/unix"
)

// TestLoopbackUp runs the boot step in a fresh network namespace (lo down,
// as in a guest that just booted) and checks lo comes up and says so.
func TestLoopbackUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare(CLONE_NEWNET) needs CAP_SYS_ADMIN and setting lo up CAP_NET_ADMIN (make test runs this as root)")
	}
	log, hook := test.NewNullLogger()
	errc := make(chan error, 1)
	up := make(chan bool, 1)
	go func() {
		// Never unlocked: the thread, left in the new namespace, ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		err := LoopbackUp(log)
		u, _ := netif.IsUp(netif.Loopback)
		up <- u
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !<-up {
		t.Error("lo is not up after LoopbackUp")
	}
	e := hook.LastEntry()
	if e == nil || e.Level != logrus.InfoLevel || e.Message != "loopback up" || e.Data["interface"] != "lo" {
		t.Errorf("log entry %+v, want info \"loopback up\" interface=lo", e)
	}
}
