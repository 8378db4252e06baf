package kvm

import "testing"

func TestTrimCPUID2(t *testing.T) {
	e := []CPUIDEntry2{{Function: 0, EAX: 0x10, EBX: 0x68747541}, {Function: 1, EAX: 0x800f12}, {}, {}}
	if got := TrimCPUID2(e); len(got) != 2 || got[1].Function != 1 {
		t.Fatalf("TrimCPUID2 kept %d entries: %+v", len(got), got)
	}
	// A zero entry inside the list is kept: only the zeroed tail goes.
	mid := []CPUIDEntry2{{Function: 0, EAX: 1}, {}, {Function: 7, EBX: 1}}
	if got := TrimCPUID2(mid); len(got) != 3 {
		t.Fatalf("TrimCPUID2 dropped an inner entry: %+v", got)
	}
	if got := TrimCPUID2(nil); len(got) != 0 {
		t.Fatalf("TrimCPUID2(nil) = %+v", got)
	}
}
