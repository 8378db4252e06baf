package kvmtest

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/kvm"
)

func TestSmoke(t *testing.T) {
	res, err := Smoke(kvm.DefaultDevice)
	if errors.Is(err, ErrNoKVM) {
		t.Skipf("no KVM on this machine: %v", err)
	}
	if err != nil {
		t.Fatalf("Smoke(%s): %v (partial result %+v)", kvm.DefaultDevice, err, res)
	}
	t.Logf("smoke: %+v", res)
	if len(res.Exits) != 2 || res.Exits[0] != kvm.ExitIO || res.Exits[1] != kvm.ExitHLT {
		t.Errorf("exits = %v, want [IO HLT]", res.Exits)
	}
}

func TestSmokeMissingDevice(t *testing.T) {
	_, err := Smoke(filepath.Join(t.TempDir(), "nokvm"))
	if !errors.Is(err, ErrNoKVM) {
		t.Fatalf("Smoke on a missing device: err = %v, want ErrNoKVM", err)
	}
}

func BenchmarkSmoke(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Smoke(kvm.DefaultDevice); err != nil {
			if errors.Is(err, ErrNoKVM) {
				b.Skip("no /dev/kvm")
			}
			b.Fatal(err)
		}
	}
}
