package vmm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/benchloss"
)

// bootCase is one way of booting the marker guest.
type bootCase struct {
	name string
	argv []string
}

const guestCmdline = "console=ttyS0 quiet panic=-1"

func qemuCases(mem int) []bootCase {
	common := []string{"-enable-kvm", "-cpu", "host", "-m", fmt.Sprint(mem), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "stdio", "-kernel", guestKernel, "-initrd", markerInitrd, "-append", guestCmdline}
	return []bootCase{
		{"qemu-pc", append([]string{"qemu-system-x86_64", "-M", "pc"}, common...)},
		{"qemu-microvm", append([]string{"qemu-system-x86_64", "-M", "microvm"}, common...)},
	}
}

// qemuHugeTLBCase is QEMU -M pc with its guest RAM from the 2 MiB hugetlb pool, as cube-vmm's -hugetlb: a
// memfd backend with hugetlb=on (no hugetlbfs mount needed; reserved when mapped, faulted on first touch).
func qemuHugeTLBCase(mem int) bootCase {
	c := qemuCases(mem)[0]
	argv := slices.Clone(c.argv)
	i := slices.Index(argv, "pc")
	argv[i] = "pc,memory-backend=ram0"
	argv = slices.Insert(argv, i+1, "-object", fmt.Sprintf("memory-backend-memfd,id=ram0,size=%dM,hugetlb=on,hugetlbsize=2M", mem))
	return bootCase{"qemu-pc-hugetlb", argv}
}

// bootToMarker starts argv and returns the time from exec to the marker line on its stdout (the guest's
// serial console). The VMM is killed once the marker is seen or on timeout. A boot that did not reach the
// marker fails with the console and stderr tail, classified (benchloss): past the timeout it is a stall, and a
// VMM that ended on its own says by its status whether the nested guest was lost (cube-vmm exit 10, QEMU's 0
// under -no-reboot: the guest reset) or failed (any other status).
func bootToMarker(ctx context.Context, argv []string, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	var console strings.Builder
	found := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(io.TeeReader(out, &console))
		for sc.Scan() {
			if strings.Contains(sc.Text(), bootMarker) {
				found <- time.Since(start)
				break
			}
		}
		io.Copy(io.Discard, out)
		close(found)
	}()
	d, ok := <-found
	if ok {
		cancel()
		cmd.Wait()
		return d, nil
	}
	// No marker: the console closed (the VMM exited on its own) or the timeout killed it. Wait before
	// cancelling, so the exit status is the VMM's own, not our SIGKILL's.
	cmd.Wait()
	stalled := ctx.Err() != nil
	// console is only read after the reader goroutine closed found, so it is not shared.
	err = fmt.Errorf("%s: no %s on the console (%v)\n%s", argv[0], bootMarker, cmd.ProcessState, tail(console.String()+stderr.String(), 30))
	if stalled {
		return 0, benchloss.Stalled(err)
	}
	reset := benchloss.CubeVMMReset
	if strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") {
		reset = benchloss.QEMUReset // qemuCases run it with -no-reboot
	}
	return 0, benchloss.Exited(cmd.ProcessState, reset, err)
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0 // every boot of this case was lost
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestPeerQEMUBootsMarkerGuest checks the comparison harness itself: QEMU with KVM inside the test host boots
// the marker guest to userspace.
func TestPeerQEMUBootsMarkerGuest(t *testing.T) {
	c := qemuCases(256)[0]
	d, err := bootToMarker(context.Background(), c.argv, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: marker after %v", c.name, d)
}
