package machine

import (
	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Conversions between KVM's structs and the snapshot format's mirrors of
// them. Where a struct has no padding the two have the same fields and Go
// converts one into the other (a field added to one side only stops that
// compiling); the others are copied field by field, and
// TestKVMStateRoundTrip checks that every field survives.

func cpuidToSnap(in []kvm.CPUIDEntry2) []snapshot.CPUIDEntry {
	out := make([]snapshot.CPUIDEntry, len(in))
	for i, e := range in {
		out[i] = snapshot.CPUIDEntry{Function: e.Function, Index: e.Index, Flags: e.Flags, EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
	}
	return out
}

func cpuidToKVM(in []snapshot.CPUIDEntry) []kvm.CPUIDEntry2 {
	out := make([]kvm.CPUIDEntry2, len(in))
	for i, e := range in {
		out[i] = kvm.CPUIDEntry2{Function: e.Function, Index: e.Index, Flags: e.Flags, EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
	}
	return out
}

func segmentToSnap(s kvm.Segment) snapshot.Segment {
	return snapshot.Segment{Base: s.Base, Limit: s.Limit, Selector: s.Selector, Type: s.Type, Present: s.Present,
		DPL: s.DPL, DB: s.DB, S: s.S, L: s.L, G: s.G, AVL: s.AVL, Unusable: s.Unusable}
}

func segmentToKVM(s snapshot.Segment) kvm.Segment {
	return kvm.Segment{Base: s.Base, Limit: s.Limit, Selector: s.Selector, Type: s.Type, Present: s.Present,
		DPL: s.DPL, DB: s.DB, S: s.S, L: s.L, G: s.G, AVL: s.AVL, Unusable: s.Unusable}
}

func sregsToSnap(s kvm.Sregs) snapshot.Sregs {
	return snapshot.Sregs{
		CS: segmentToSnap(s.CS), DS: segmentToSnap(s.DS), ES: segmentToSnap(s.ES), FS: segmentToSnap(s.FS),
		GS: segmentToSnap(s.GS), SS: segmentToSnap(s.SS), TR: segmentToSnap(s.TR), LDT: segmentToSnap(s.LDT),
		GDT: snapshot.DTable{Base: s.GDT.Base, Limit: s.GDT.Limit}, IDT: snapshot.DTable{Base: s.IDT.Base, Limit: s.IDT.Limit},
		CR0: s.CR0, CR2: s.CR2, CR3: s.CR3, CR4: s.CR4, CR8: s.CR8, EFER: s.EFER, APICBase: s.APICBase,
		InterruptBitmap: s.InterruptBitmap,
	}
}

func sregsToKVM(s snapshot.Sregs) kvm.Sregs {
	return kvm.Sregs{
		CS: segmentToKVM(s.CS), DS: segmentToKVM(s.DS), ES: segmentToKVM(s.ES), FS: segmentToKVM(s.FS),
		GS: segmentToKVM(s.GS), SS: segmentToKVM(s.SS), TR: segmentToKVM(s.TR), LDT: segmentToKVM(s.LDT),
		GDT: kvm.DTable{Base: s.GDT.Base, Limit: s.GDT.Limit}, IDT: kvm.DTable{Base: s.IDT.Base, Limit: s.IDT.Limit},
		CR0: s.CR0, CR2: s.CR2, CR3: s.CR3, CR4: s.CR4, CR8: s.CR8, EFER: s.EFER, APICBase: s.APICBase,
		InterruptBitmap: s.InterruptBitmap,
	}
}

func xcrsToSnap(x kvm.XCRs) snapshot.XCRs {
	out := snapshot.XCRs{NrXCRs: x.NrXCRs, Flags: x.Flags, Padding: x.Padding}
	for i, e := range x.XCRs {
		out.XCRs[i] = snapshot.XCR(e)
	}
	return out
}

func xcrsToKVM(x snapshot.XCRs) kvm.XCRs {
	out := kvm.XCRs{NrXCRs: x.NrXCRs, Flags: x.Flags, Padding: x.Padding}
	for i, e := range x.XCRs {
		out.XCRs[i] = kvm.XCR(e)
	}
	return out
}

func msrsToSnap(in []kvm.MSREntry) []snapshot.MSR {
	out := make([]snapshot.MSR, len(in))
	for i, e := range in {
		out[i] = snapshot.MSR(e)
	}
	return out
}

func msrsToKVM(in []snapshot.MSR) []kvm.MSREntry {
	out := make([]kvm.MSREntry, len(in))
	for i, e := range in {
		out[i] = kvm.MSREntry(e)
	}
	return out
}

func irqchipToSnap(c kvm.IRQChip) snapshot.IRQChip {
	return snapshot.IRQChip{ChipID: c.ChipID, Chip: c.Chip}
}

func irqchipToKVM(c snapshot.IRQChip) kvm.IRQChip {
	return kvm.IRQChip{ChipID: c.ChipID, Chip: c.Chip}
}

func pitToSnap(p kvm.PITState2) snapshot.PIT {
	out := snapshot.PIT{Flags: p.Flags, Reserved: p.Reserved}
	for i, c := range p.Channels {
		out.Channels[i] = snapshot.PITChannel(c)
	}
	return out
}

func pitToKVM(p snapshot.PIT) kvm.PITState2 {
	out := kvm.PITState2{Flags: p.Flags, Reserved: p.Reserved}
	for i, c := range p.Channels {
		out.Channels[i] = kvm.PITChannelState(c)
	}
	return out
}

func clockToSnap(c kvm.ClockData) snapshot.Clock {
	return snapshot.Clock{Clock: c.Clock, Flags: c.Flags, Realtime: c.Realtime, HostTSC: c.HostTSC}
}
