package kvmtest

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

func newGuestT(t *testing.T, code []byte, opt GuestOptions) *Guest {
	t.Helper()
	g, err := NewGuest(kvm.DefaultDevice, code, opt)
	if errors.Is(err, ErrNoKVM) {
		t.Skipf("no KVM on this machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// TestStateRoundTrip reads every piece of vCPU and VM state a snapshot
// needs, writes it back, and reads it again.
func TestStateRoundTrip(t *testing.T) {
	g := newGuestT(t, []byte{0xf4}, GuestOptions{IRQChip: true})
	cpu, vm := g.CPU, g.VM

	// CPUID first: KVM wants it before most other state.
	sup, err := g.Sys.SupportedCPUID()
	if err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetCPUID2(sup); err != nil {
		t.Fatal(err)
	}
	got, err := cpu.GetCPUID2()
	if err != nil {
		t.Fatal(err)
	}
	// KVM may drop entries it considers redundant; it must keep most.
	if len(got) == 0 || len(got) > len(sup) {
		t.Errorf("cpuid2: set %d entries, got %d", len(sup), len(got))
	}
	t.Logf("cpuid2: set %d entries, read back %d", len(sup), len(got))

	roundTrip := func(name string, get func() (any, error), set func(any) error) {
		t.Helper()
		a, err := get()
		if err != nil {
			t.Errorf("%s: get: %v", name, err)
			return
		}
		if err := set(a); err != nil {
			t.Errorf("%s: set: %v", name, err)
			return
		}
		b, err := get()
		if err != nil {
			t.Errorf("%s: get after set: %v", name, err)
			return
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: changed across set/get:\n%+v\n%+v", name, a, b)
		}
	}
	roundTrip("mp_state", func() (any, error) { return cpu.GetMPState() }, func(v any) error { return cpu.SetMPState(v.(kvm.MPState)) })
	roundTrip("regs", func() (any, error) { return cpu.GetRegs() }, func(v any) error { return cpu.SetRegs(v.(kvm.Regs)) })
	roundTrip("sregs", func() (any, error) { return cpu.GetSregs() }, func(v any) error { return cpu.SetSregs(v.(kvm.Sregs)) })
	roundTrip("fpu", func() (any, error) { return cpu.GetFPU() }, func(v any) error { return cpu.SetFPU(v.(kvm.FPU)) })
	roundTrip("xsave", func() (any, error) { x, err := cpu.GetXSave(); return x, err },
		func(v any) error { return cpu.SetXSave(v.(*kvm.XSave).Region[:]) })
	if sz, err := g.Sys.CheckExtension(kvm.CapXSave2); err == nil && sz >= 4096 {
		roundTrip("xsave2", func() (any, error) { return cpu.GetXSave2(sz) }, func(v any) error { return cpu.SetXSave(v.([]uint32)) })
	}
	roundTrip("xcrs", func() (any, error) { return cpu.GetXCRs() }, func(v any) error { return cpu.SetXCRs(v.(kvm.XCRs)) })
	roundTrip("lapic", func() (any, error) { return cpu.GetLAPIC() }, func(v any) error { return cpu.SetLAPIC(v.(kvm.LAPICState)) })
	roundTrip("debugregs", func() (any, error) { return cpu.GetDebugRegs() }, func(v any) error { return cpu.SetDebugRegs(v.(kvm.DebugRegs)) })
	roundTrip("vcpu_events", func() (any, error) { return cpu.GetVCPUEvents() }, func(v any) error { return cpu.SetVCPUEvents(v.(kvm.VCPUEvents)) })
	for _, id := range []uint32{kvm.IRQChipPICMaster, kvm.IRQChipPICSlave, kvm.IRQChipIOAPIC} {
		roundTrip("irqchip", func() (any, error) { return vm.GetIRQChip(id) }, func(v any) error { return vm.SetIRQChip(v.(kvm.IRQChip)) })
	}
	// KVM re-bases each channel's count_load_time to "now" on set.
	pit := func() (any, error) {
		p, err := vm.GetPIT2()
		for i := range p.Channels {
			p.Channels[i].CountLoadTime = 0
		}
		return p, err
	}
	roundTrip("pit2", pit, func(v any) error { return vm.SetPIT2(v.(kvm.PITState2)) })

	// MSRs: every index KVM lists must read and write back.
	idx, err := g.Sys.MSRIndexList()
	if err != nil {
		t.Fatal(err)
	}
	msrs, err := cpu.GetMSRs(idx)
	if err != nil {
		// Some listed MSRs are not readable on every host; report which.
		t.Logf("all-MSR read: %v; retrying one by one", err)
		msrs = nil
		for _, i := range idx {
			if e, err := cpu.GetMSRs([]uint32{i}); err == nil {
				msrs = append(msrs, e...)
			} else {
				t.Logf("msr %#x unreadable: %v", i, err)
			}
		}
	}
	if len(msrs) == 0 {
		t.Fatal("no MSR could be read")
	}
	if err := cpu.SetMSRs(msrs); err != nil {
		t.Errorf("set %d msrs: %v", len(msrs), err)
	}
	t.Logf("%d of %d listed MSRs round-tripped", len(msrs), len(idx))

	// The clock moves, so only check that set/get works and is monotonic.
	c, err := vm.GetClock()
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.SetClock(kvm.ClockData{Clock: c.Clock}); err != nil {
		t.Fatal(err)
	}
	if c2, err := vm.GetClock(); err != nil || c2.Clock < c.Clock {
		t.Errorf("clock after set: %+v, %v (was %d)", c2, err, c.Clock)
	}
	t.Logf("clock flags %#x", c.Flags)
}

func TestDirtyLog(t *testing.T) {
	code := []byte{
		0xc6, 0x04, 0x25, 0x00, 0x00, 0x01, 0x00, 0x01, // mov byte [0x10000], 1
		0xc6, 0x04, 0x25, 0x00, 0x30, 0x01, 0x00, 0x01, // mov byte [0x13000], 1
		0xc6, 0x04, 0x25, 0x00, 0xf0, 0x1f, 0x00, 0x01, // mov byte [0x1ff000], 1
		0xf4,
	}
	g := newGuestT(t, code, GuestOptions{DirtyLog: true})
	bitmap := make([]uint64, MemSize/4096/64)
	if err := g.VM.GetDirtyLog(0, bitmap); err != nil {
		t.Fatal(err)
	}
	if err := runToHLT(g.CPU); err != nil {
		t.Fatal(err)
	}
	if err := g.VM.GetDirtyLog(0, bitmap); err != nil {
		t.Fatal(err)
	}
	dirty := func(gpa uint64) bool { p := gpa / 4096; return bitmap[p/64]&(1<<(p%64)) != 0 }
	for _, a := range []uint64{0x10000, 0x13000, 0x1ff000} {
		if !dirty(a) {
			t.Errorf("page %#x written by the guest is not dirty", a)
		}
	}
	for _, a := range []uint64{0x11000, 0x50000, 0x1fe000} {
		if dirty(a) {
			t.Errorf("untouched page %#x is dirty", a)
		}
	}
	// Fetching clears the log.
	if err := g.VM.GetDirtyLog(0, bitmap); err != nil {
		t.Fatal(err)
	}
	if dirty(0x10000) {
		t.Error("dirty log not cleared by KVM_GET_DIRTY_LOG")
	}
	if err := g.VM.GetDirtyLog(0, nil); err == nil {
		t.Error("empty bitmap accepted")
	}
}

func runToHLT(cpu *kvm.VCPU) error {
	for {
		err := cpu.Run()
		if errors.Is(err, kvm.ErrInterrupted) {
			continue
		}
		if err != nil {
			return err
		}
		rd := cpu.RunData()
		switch rd.ExitReason() {
		case kvm.ExitHLT:
			return nil
		case kvm.ExitMMIO, kvm.ExitIO:
			continue
		}
		if err := rd.ExitError(); err != nil {
			return err
		}
		return errors.New("unexpected exit " + rd.ExitReason().String())
	}
}

// TestIOEventFD checks that registered writes signal the eventfd instead
// of exiting to userspace.
func TestIOEventFD(t *testing.T) {
	code := []byte{
		0xc7, 0x04, 0x25, 0x00, 0x00, 0x00, 0x10, 0x07, 0x00, 0x00, 0x00, // mov dword [0x10000000], 7
		0x66, 0xba, 0x00, 0x02, // mov dx, 0x200
		0x66, 0xef, // out dx, ax
		0xf4,
	}
	g := newGuestT(t, code, GuestOptions{})
	mfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	pfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	if err := g.VM.IOEventFD(mfd, 0x10000000, 4, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.VM.IOEventFD(pfd, 0x200, 2, true, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.VM.IOEventFD(pfd, 0x200, 3, true, nil); err == nil {
		t.Error("length 3 accepted")
	}
	// Any MMIO/IO exit here means the eventfd did not take the access.
	for {
		err := g.CPU.Run()
		if errors.Is(err, kvm.ErrInterrupted) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if rs := g.CPU.RunData().ExitReason(); rs != kvm.ExitHLT {
		t.Fatalf("first exit %v, want HLT (accesses should have gone to eventfds)", rs)
	}
	for name, fd := range map[string]int{"mmio": mfd, "pio": pfd} {
		var b [8]byte
		if n, err := unix.Read(fd, b[:]); err != nil || n != 8 || le.Uint64(b[:]) != 1 {
			t.Errorf("%s eventfd: read %d %v %x, want count 1", name, n, err, b)
		}
	}
	if err := g.VM.IOEventFDDetach(mfd, 0x10000000, 4, false, nil); err != nil {
		t.Error(err)
	}
}

// TestIRQFD raises GSI 4 through an eventfd and looks for it in the
// in-kernel PIC's interrupt request register.
func TestIRQFD(t *testing.T) {
	g := newGuestT(t, []byte{0xf4}, GuestOptions{IRQChip: true})
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := g.VM.IRQFD(efd, 4); err != nil {
		t.Fatal(err)
	}
	var one [8]byte
	le.PutUint64(one[:], 1)
	if _, err := unix.Write(efd, one[:]); err != nil {
		t.Fatal(err)
	}
	// irqfd injection runs from a kernel work item: poll for it.
	const irrOffset = 1 // struct kvm_pic_state { last_irr; irr; ... }
	deadline := time.Now().Add(10 * time.Second)
	for {
		chip, err := g.VM.GetIRQChip(kvm.IRQChipPICMaster)
		if err != nil {
			t.Fatal(err)
		}
		if chip.Chip[irrOffset]&(1<<4) != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GSI 4 never reached the PIC (irr %#x)", chip.Chip[irrOffset])
		}
		time.Sleep(time.Millisecond)
	}
	if err := g.VM.IRQFDDetach(efd, 4); err != nil {
		t.Error(err)
	}
	if err := g.VM.IRQLine(4, true); err != nil {
		t.Error(err)
	}
	if err := g.VM.SignalMSI(kvm.MSI{AddressLo: 0xfee00000, Data: 0x30}); err != nil {
		t.Errorf("signal msi: %v", err)
	}
	routes := []kvm.IRQRoutingEntry{{GSI: 24, Type: kvm.IRQRoutingMSI, U: [8]uint32{0xfee00000, 0, 0x31}}}
	if err := g.VM.SetGSIRouting(routes); err != nil {
		t.Errorf("gsi routing: %v", err)
	}
}
