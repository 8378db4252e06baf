package control

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// diskVM records disk-set calls; serial "bad" fails like a VMM would.
type diskVM struct {
	fakeVM
	calls []string
}

func (d *diskVM) SetDisk(serial, path string, readOnly bool) (*DiskSetResult, error) {
	if serial == "bad" {
		return nil, fmt.Errorf("set disk %q: no such disk", serial)
	}
	if readOnly {
		path += ":ro"
	}
	d.calls = append(d.calls, serial+"="+path)
	return &DiskSetResult{Serial: serial, Path: path, Sectors: 8}, nil
}

func TestDiskSet(t *testing.T) {
	vm := &diskVM{fakeVM: fakeVM{state: "running", stopped: make(chan struct{})}}
	path := filepath.Join(t.TempDir(), "ctl.sock")
	s, err := Listen(path, vm)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := Dial(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.SetDisk(t.Context(), "cube-slot-1", "/img/a.img")
	if err != nil {
		t.Fatal(err)
	}
	if res != (DiskSetResult{Serial: "cube-slot-1", Path: "/img/a.img", Sectors: 8}) {
		t.Errorf("result %+v", res)
	}
	if _, err := c.SetDiskReadOnly(t.Context(), "cube-slot-2", "/dev/loop3"); err != nil {
		t.Fatal(err)
	}
	if got := vm.calls[len(vm.calls)-1]; got != "cube-slot-2=/dev/loop3:ro" {
		t.Errorf("read_only not carried to the target: %s", got)
	}
	for _, tc := range []struct{ serial, path, want string }{
		{"", "/img/a.img", "no serial"},
		{"cube-slot-1", "", "no path"},
		{"cube-slot-1", "img/a.img", "not absolute"},
		{"bad", "/img/a.img", "no such disk"},
	} {
		if _, err := c.SetDisk(t.Context(), tc.serial, tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("disk-set %q %q: %v, want an error with %q", tc.serial, tc.path, err, tc.want)
		}
	}
	if len(vm.calls) != 2 {
		t.Errorf("target saw %v, want only the valid request", vm.calls)
	}

	// A target without drives refuses the op by name.
	plain := &fakeVM{state: "running", stopped: make(chan struct{})}
	p2 := filepath.Join(t.TempDir(), "ctl2.sock")
	s2, err := Listen(p2, plain)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	c2, err := Dial(t.Context(), p2)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.SetDisk(t.Context(), "cube-slot-1", "/img/a.img"); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("disk-set on a target without disks: %v", err)
	}
}
