package testhost

import (
	"strings"
	"testing"
)

func TestPlatformDefaultsAndEnv(t *testing.T) {
	for _, e := range []string{EnvAccel, EnvCPU, EnvAppend, EnvModuleParams, EnvKVMAMD, EnvSMP, EnvQEMUVariant} {
		t.Setenv(e, "")
	}
	p := Platform{}.withDefaults()
	if p.Accel != DefaultAccel || p.CPU != DefaultCPU || p.KVMAMD != DefaultKVMAMD || p.QEMU != DefaultQEMU || p.Append != "" || p.ModuleParams != "" {
		t.Fatalf("defaults: %+v", p)
	}
	t.Setenv(EnvCPU, "EPYC-Rome,+svm,+npt")
	t.Setenv(EnvKVMAMD, KVMAMDStock)
	t.Setenv(EnvSMP, "1")
	t.Setenv(EnvQEMUVariant, QEMUPatched)
	o := (&Options{}).withDefaults()
	if o.Platform.CPU != "EPYC-Rome,+svm,+npt" || o.Platform.KVMAMD != KVMAMDStock || o.Platform.QEMU != QEMUPatched || o.CPUs != 1 {
		t.Fatalf("from the environment: %+v, %d vCPUs", o.Platform, o.CPUs)
	}
	// A field set in code wins over the environment.
	if p := (Platform{CPU: "EPYC,+svm"}).withDefaults(); p.CPU != "EPYC,+svm" {
		t.Fatalf("explicit CPU overridden: %q", p.CPU)
	}
	if s := o.Platform.String(); !strings.Contains(s, "cpu=EPYC-Rome,+svm,+npt") || !strings.Contains(s, "kvm-amd=stock") || !strings.Contains(s, "qemu=patched") {
		t.Fatalf("String: %q", s)
	}
}

func TestPlatformValidate(t *testing.T) {
	good := Platform{Accel: DefaultAccel, CPU: DefaultCPU, KVMAMD: KVMAMDSTIVMRUN, QEMU: QEMUPatched, ModuleParams: "kvm_amd.npt=0 kvm-amd.vgif=0 kvm.tdp_mmu=0"}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    Platform
		want string
	}{
		{Platform{CPU: DefaultCPU, KVMAMD: "patched"}, EnvKVMAMD},
		{Platform{CPU: "EPYC", KVMAMD: KVMAMDStock}, "+svm"},
		{Platform{CPU: DefaultCPU, KVMAMD: KVMAMDStock, ModuleParams: "npt=0"}, "MODULE.PARAM=VALUE"},
		{Platform{CPU: DefaultCPU, KVMAMD: KVMAMDStock, ModuleParams: "kvm_amd.npt='0 1'"}, "MODULE.PARAM=VALUE"},
		{Platform{CPU: DefaultCPU, KVMAMD: KVMAMDStock, QEMU: "upstream"}, EnvQEMUVariant},
	} {
		err := c.p.validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.p, err, c.want)
		}
	}
	t.Setenv(EnvSMP, "zero")
	if _, err := smpFromEnv(); err == nil || !strings.Contains(err.Error(), EnvSMP) {
		t.Errorf("%s=zero: %v", EnvSMP, err)
	}
}

func TestModuleParamsFile(t *testing.T) {
	mods := []string{"kernel/virt/lib/irqbypass.ko", "kernel/arch/x86/kvm/kvm.ko", "kernel/arch/x86/kvm/kvm-amd.ko"}
	b, err := moduleParamsFile("kvm-amd.npt=0 kvm.tdp_mmu=0 kvm_amd.vgif=0", mods)
	if err != nil {
		t.Fatal(err)
	}
	if want := "kvm tdp_mmu=0\nkvm_amd npt=0 vgif=0\n"; string(b) != want {
		t.Fatalf("modparams %q, want %q", b, want)
	}
	if b, err := moduleParamsFile("", mods); err != nil || len(b) != 0 {
		t.Fatalf("no parameters: %q %v", b, err)
	}
	if _, err := moduleParamsFile("loop.max_loop=8", mods); err == nil || !strings.Contains(err.Error(), "Options.Modules") {
		t.Fatalf("parameter for a module not loaded: %v", err)
	}
}
