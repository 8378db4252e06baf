package kvm

import (
	"encoding/binary"
	"testing"
)

func runPage(reason ExitReason, union []byte) RunData {
	r := make(RunData, 4096)
	binary.LittleEndian.PutUint32(r[runExitReason:], uint32(reason))
	copy(r[runExitUnion:], union)
	return r
}

func TestIODecode(t *testing.T) {
	u := make([]byte, 16)
	u[0], u[1] = IODirOut, 2
	binary.LittleEndian.PutUint16(u[2:], 0x3f8)
	binary.LittleEndian.PutUint32(u[4:], 3)
	binary.LittleEndian.PutUint64(u[8:], 1024)
	r := runPage(ExitIO, u)
	e, err := r.IO()
	if err != nil || e.Port != 0x3f8 || e.Size != 2 || e.Count != 3 || len(e.Data) != 6 || &e.Data[0] != &r[1024] {
		t.Fatalf("io %+v %v", e, err)
	}
	for name, mut := range map[string]func([]byte){
		"size 3":          func(u []byte) { u[1] = 3 },
		"offset past end": func(u []byte) { binary.LittleEndian.PutUint64(u[8:], 4095) },
		"huge offset":     func(u []byte) { binary.LittleEndian.PutUint64(u[8:], ^uint64(0)-1) },
		"huge count":      func(u []byte) { binary.LittleEndian.PutUint32(u[4:], ^uint32(0)) },
		"zero count":      func(u []byte) { binary.LittleEndian.PutUint32(u[4:], 0) },
	} {
		v := append([]byte(nil), u...)
		mut(v)
		if _, err := runPage(ExitIO, v).IO(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := runPage(ExitHLT, u).IO(); err == nil {
		t.Error("IO() on an HLT exit accepted")
	}
}

func TestMMIODecode(t *testing.T) {
	u := make([]byte, 24)
	binary.LittleEndian.PutUint64(u[0:], 0xfeb00000)
	copy(u[8:], []byte{1, 2, 3, 4})
	binary.LittleEndian.PutUint32(u[16:], 4)
	u[20] = 1
	e, err := runPage(ExitMMIO, u).MMIO()
	if err != nil || e.Addr != 0xfeb00000 || !e.IsWrite || len(e.Data) != 4 || e.Data[3] != 4 {
		t.Fatalf("mmio %+v %v", e, err)
	}
	binary.LittleEndian.PutUint32(u[16:], 9)
	if _, err := runPage(ExitMMIO, u).MMIO(); err == nil {
		t.Error("length 9 accepted")
	}
}

// FuzzRunDecode feeds arbitrary kvm_run contents to every decoder: none
// may panic or return data outside the region.
func FuzzRunDecode(f *testing.F) {
	f.Add(uint32(ExitIO), make([]byte, 64))
	f.Add(uint32(ExitMMIO), make([]byte, 64))
	f.Add(uint32(ExitInternalError), []byte{1, 0, 0, 0, 200, 0, 0, 0})
	f.Add(uint32(ExitSystemEvent), []byte{2, 0, 0, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, reason uint32, union []byte) {
		r := runPage(ExitReason(reason), union)
		if e, err := r.IO(); err == nil && len(e.Data) != int(e.Size)*int(e.Count) {
			t.Fatalf("io data %d bytes for %d×%d", len(e.Data), e.Size, e.Count)
		}
		if e, err := r.MMIO(); err == nil && (len(e.Data) == 0 || len(e.Data) > 8) {
			t.Fatalf("mmio data of %d bytes", len(e.Data))
		}
		r.FailEntry()
		r.InternalError()
		r.SystemEvent()
		_ = r.ExitError()
		_ = ExitReason(reason).String()
	})
}
