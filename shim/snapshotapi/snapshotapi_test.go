package snapshotapi

import "testing"

// TestServiceName: the name clients and tools use is the generated service's.
func TestServiceName(t *testing.T) {
	svcs := File_snapshot_proto.Services()
	if svcs.Len() != 1 {
		t.Fatalf("%d services in snapshot.proto", svcs.Len())
	}
	if got := string(svcs.Get(0).FullName()); got != ServiceName {
		t.Fatalf("service %q, ServiceName %q", got, ServiceName)
	}
}
