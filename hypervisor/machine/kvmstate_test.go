package machine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// TestKVMStateRoundTrip: every field of every KVM struct a snapshot holds
// reaches the format's mirror under the same name and comes back: a field
// added to a KVM struct and not to its mirror (or not copied) fails here.
func TestKVMStateRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(name string, k any, toSnap func(any) any, toKVM func(any) any) {
		t.Helper()
		kv := reflect.New(reflect.TypeOf(k)).Elem()
		fill(kv, r)
		s := toSnap(kv.Interface())
		if err := sameFields(kv, reflect.ValueOf(s), name); err != nil {
			t.Errorf("%s to snapshot: %v", name, err)
		}
		if toKVM != nil {
			if back := toKVM(s); back != kv.Interface() {
				t.Errorf("%s: round trip through the snapshot's mirror changed it:\n%+v\n%+v", name, kv.Interface(), back)
			}
		}
	}
	check("Regs", kvm.Regs{}, func(v any) any { return snapshot.Regs(v.(kvm.Regs)) }, func(v any) any { return kvm.Regs(v.(snapshot.Regs)) })
	check("Sregs", kvm.Sregs{}, func(v any) any { return sregsToSnap(v.(kvm.Sregs)) }, func(v any) any { return sregsToKVM(v.(snapshot.Sregs)) })
	check("XCRs", kvm.XCRs{}, func(v any) any { return xcrsToSnap(v.(kvm.XCRs)) }, func(v any) any { return xcrsToKVM(v.(snapshot.XCRs)) })
	check("DebugRegs", kvm.DebugRegs{}, func(v any) any { return snapshot.DebugRegs(v.(kvm.DebugRegs)) }, func(v any) any { return kvm.DebugRegs(v.(snapshot.DebugRegs)) })
	check("LAPICState", kvm.LAPICState{}, func(v any) any { return snapshot.LAPIC(v.(kvm.LAPICState)) }, func(v any) any { return kvm.LAPICState(v.(snapshot.LAPIC)) })
	check("MPState", kvm.MPState{}, func(v any) any { return snapshot.MPState(v.(kvm.MPState)) }, func(v any) any { return kvm.MPState(v.(snapshot.MPState)) })
	check("VCPUEvents", kvm.VCPUEvents{}, func(v any) any { return snapshot.VCPUEvents(v.(kvm.VCPUEvents)) }, func(v any) any { return kvm.VCPUEvents(v.(snapshot.VCPUEvents)) })
	check("IRQChip", kvm.IRQChip{}, func(v any) any { return irqchipToSnap(v.(kvm.IRQChip)) }, func(v any) any { return irqchipToKVM(v.(snapshot.IRQChip)) })
	check("PITState2", kvm.PITState2{}, func(v any) any { return pitToSnap(v.(kvm.PITState2)) }, func(v any) any { return pitToKVM(v.(snapshot.PIT)) })
	check("ClockData", kvm.ClockData{}, func(v any) any { return clockToSnap(v.(kvm.ClockData)) }, nil)
	check("MSREntry", kvm.MSREntry{},
		func(v any) any { return msrsToSnap([]kvm.MSREntry{v.(kvm.MSREntry)})[0] },
		func(v any) any { return msrsToKVM([]snapshot.MSR{v.(snapshot.MSR)})[0] })
	check("CPUIDEntry2", kvm.CPUIDEntry2{},
		func(v any) any { return cpuidToSnap([]kvm.CPUIDEntry2{v.(kvm.CPUIDEntry2)})[0] },
		func(v any) any { return cpuidToKVM([]snapshot.CPUIDEntry{v.(snapshot.CPUIDEntry)})[0] })
}

// fill sets every settable field (blank padding is left zero) to random bits.
func fill(v reflect.Value, r *rand.Rand) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				fill(f, r)
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), r)
		}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(r.Uint64())
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(r.Uint64()))
	default:
		panic(fmt.Sprintf("fill: %v", v.Type()))
	}
}

// sameFields compares a KVM value with its mirror: the same named fields
// (blank padding aside) holding the same numbers.
func sameFields(k, s reflect.Value, path string) error {
	switch k.Kind() {
	case reflect.Struct:
		if s.Kind() != reflect.Struct {
			return fmt.Errorf("%s: %v mirrored as %v", path, k.Type(), s.Type())
		}
		n := 0
		for i := range k.NumField() {
			f := k.Type().Field(i)
			if f.Name == "_" {
				continue
			}
			n++
			sf := s.FieldByName(f.Name)
			if !sf.IsValid() {
				return fmt.Errorf("%s.%s: not in the snapshot's mirror", path, f.Name)
			}
			if err := sameFields(k.Field(i), sf, path+"."+f.Name); err != nil {
				return err
			}
		}
		if n != s.NumField() {
			return fmt.Errorf("%s: %d fields, the mirror has %d", path, n, s.NumField())
		}
	case reflect.Array:
		if s.Kind() != reflect.Array || s.Len() != k.Len() {
			return fmt.Errorf("%s: %v mirrored as %v", path, k.Type(), s.Type())
		}
		for i := range k.Len() {
			if err := sameFields(k.Index(i), s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		if k.Kind() != s.Kind() || k.Interface() != reflect.ValueOf(s.Interface()).Convert(k.Type()).Interface() {
			return fmt.Errorf("%s: %v (%v), mirror has %v (%v)", path, k.Interface(), k.Type(), s.Interface(), s.Type())
		}
	}
	return nil
}
