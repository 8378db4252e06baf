package cubetest

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LoopDevice attaches a loop device over the file img (through
// /dev/loop-control, no losetup needed) and returns its path; a cleanup
// detaches it (LOOP_CLR_FD: when something still has it open, the kernel
// detaches it at the last close).
func LoopDevice(t *testing.T, img string) string {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("loop device: %v (is the loop module loaded?)", err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer backing.Close()
	// Another process (containerd's diff applier) may take the same free
	// device between GET_FREE and SET_FD: EBUSY, try the next.
	for try := 0; try < 10; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatalf("LOOP_CTL_GET_FREE: %v", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		var f *os.File
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			// devtmpfs makes the node; give it a moment.
			if f, err = os.OpenFile(dev, os.O_RDWR, 0); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("open %s: %v", dev, err)
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_FD, int(backing.Fd()))
		if errors.Is(err, unix.EBUSY) {
			f.Close()
			continue
		}
		if err != nil {
			f.Close()
			t.Fatalf("LOOP_SET_FD %s: %v", dev, err)
		}
		t.Cleanup(func() {
			defer f.Close()
			if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
				t.Errorf("detach %s: %v", dev, err)
			}
		})
		return dev
	}
	t.Fatal("no free loop device after 10 tries")
	return ""
}
