package serial

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/snapshot/snapshottest"
)

func TestState(t *testing.T) {
	s := New(nil, nil)
	s.Write(3, []byte{0x83}) // LCR with DLAB
	s.Write(0, []byte{1})    // DLL 1: 115200 baud
	s.Write(3, []byte{0x03}) // 8n1
	s.Enqueue([]byte("in"))
	snapshottest.RoundTrip(t, Kind, s, New(nil, nil))
	snapshottest.Encoding(t, `{"IER":1,"LCR":3,"MCR":8,"SCR":0,"FCR":0,"DLL":1,"DLM":0,"THREPending":true,"Input":"aW4="}`, &State{})
	snapshottest.Encoding(t, `{"IER":0,"LCR":0,"MCR":0,"SCR":0,"FCR":0,"DLL":12,"DLM":0,"THREPending":false,"Input":null}`, &State{})
	snapshottest.Refusals(t, s, "")
	big := fmt.Sprintf(`{"Input":"%0*d"}`, maxSavedInput/3*4+8, 0)
	if err := New(nil, nil).RestoreState([]byte(big)); !errors.Is(err, snapshot.ErrCorrupt) {
		t.Errorf("a state with %d bytes of input: %v, want ErrCorrupt", len(big)/4*3, err)
	}
}

func FuzzRestoreState(f *testing.F) {
	snapshottest.Fuzz(f, New(nil, nil))
}
