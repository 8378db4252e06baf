// Package benchloss lets an end-to-end benchmark survive the loss of a nested VM in the test host. Under the
// TCG emulation of nested AMD-V a nested guest is sometimes lost (README "Known problems"): it triple-faults
// (cube-vmm exits 10; QEMU run with -no-reboot exits 0), it stalls (the console stops, the agent or the control
// socket never answers), or its VMM is gone (killed by a signal the benchmark did not send, or the sandbox's
// VM died under `ctr run`). Such a sample says nothing about our code: it is retried with a fresh VM, counted,
// printed with its evidence and left out of the medians. Any other error is a real failure and still fails
// the benchmark, as does a run that loses more VMs than its bounds allow.
//
// The place that sees the failure classifies it, since only it knows the evidence: Exited (a VMM process that
// ended while it was still needed), Stalled (a wait that timed out) and Gone (a VMM known to have died) wrap
// an error as a *LostError; everything else stays a real error. A Counter runs the samples.
package benchloss

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Exit statuses by which a VMM says its guest reset. The benchmarks' guests never reboot, so a reset is a
// triple fault.
const (
	// CubeVMMReset is cube-vmm's vmmcmd.ExitReboot (a unit test keeps them equal; this package does not import
	// the VMM).
	CubeVMMReset = 10
	// QEMUReset is QEMU's status after a guest reset when it runs with -no-reboot (without it, QEMU reboots
	// the guest and the loss shows only as a stall).
	QEMUReset = 0
)

// LostError is a VM lost to the test host: Reason names the sign (exit 10, a stall, the VMM gone), Err is
// what failed with its evidence (exit status, console tail).
type LostError struct {
	Reason string
	Err    error
}

func (e *LostError) Error() string { return "lost VM (" + e.Reason + "): " + e.Err.Error() }
func (e *LostError) Unwrap() error { return e.Err }

// Lost wraps err as a lost VM for reason. A nil err stays nil, and an error already marked lost keeps its reason.
func Lost(reason string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := IsLost(err); ok {
		return err
	}
	return &LostError{Reason: reason, Err: err}
}

// IsLost reports whether err (or an error it wraps) is a lost VM.
func IsLost(err error) (*LostError, bool) {
	var l *LostError
	ok := errors.As(err, &l)
	return l, ok
}

// Stalled marks err, a wait for the guest or its VMM that timed out, as a lost VM: the guest stalled.
func Stalled(err error) error { return Lost("stall: no answer before the timeout", err) }

// Gone marks err as a lost VM whose VMM died under it (the shim reports it; the status is what it saw).
func Gone(status string, err error) error { return Lost("VMM gone: "+status, err) }

// Exited classifies err, the failure of a VMM process ps that ended while the benchmark still needed it (it
// had not asked it to stop): a guest reset (exit status reset: CubeVMMReset or QEMUReset) or a signal the
// benchmark did not send (the OOM killer, a crash of the test host's KVM) is a lost VM; any other status —
// cube-vmm's own failure (1), a usage error (2), a guest panic (11) — is a real failure and err is returned
// as is. A nil ps (the process has not been waited for) is a real failure too.
func Exited(ps *os.ProcessState, reset int, err error) error {
	if err == nil || ps == nil {
		return err
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Lost(fmt.Sprintf("VMM gone: killed by signal %d (%v)", int(ws.Signal()), ws.Signal()), err)
	}
	if ps.ExitCode() == reset {
		return Lost(fmt.Sprintf("exit status %d: the guest reset (a triple fault)", reset), err)
	}
	return err
}

// ExitedStatus is Exited for a caller that kept only the exit status: code is -1 for a process killed by a
// signal (as exec's ExitCode reports it).
func ExitedStatus(code, reset int, err error) error {
	switch {
	case err == nil:
		return nil
	case code == -1:
		return Lost("VMM gone: killed by a signal", err)
	case code == reset:
		return Lost(fmt.Sprintf("exit status %d: the guest reset (a triple fault)", reset), err)
	}
	return err
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
