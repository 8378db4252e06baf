package testhost

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/contrib/guestimage"
)

// Fixtures with the lines of Debian 6.1.192's svm.c and vmenter.S that stiVMRUNPatch edits.
const (
	svmFixture = `static noinstr void svm_vcpu_enter_exit(struct kvm_vcpu *vcpu, bool spec_ctrl_intercepted)
{
	guest_state_enter_irqoff();

	raw_local_irq_enable();

	amd_clear_divider();

	if (sev_es_guest(vcpu->kvm))
		__svm_sev_es_vcpu_run(svm, spec_ctrl_intercepted);
	else
		__svm_vcpu_run(svm, spec_ctrl_intercepted);

	raw_local_irq_disable();

	guest_state_exit_irqoff();
}
`
	vmenterFixture = `	/* Enter guest mode */
3:	vmrun %_ASM_AX
4:
	/* Pop @svm to RAX while it's the only available register. */
	pop %_ASM_AX
	/* Enter guest mode */
1:	vmrun %_ASM_AX
2:

	/* Pop @svm to RDI, guest registers have been saved already. */
`
)

func TestKVMAMDPatchApplies(t *testing.T) {
	svm, err := patchText("arch/x86/kvm", "svm/svm.c", svmFixture, stiVMRUNPatch)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(svm, "raw_local_irq") || !strings.Contains(svm, "amd_clear_divider();") || !strings.Contains(svm, "guest_state_exit_irqoff();") {
		t.Fatalf("patched svm.c:\n%s", svm)
	}
	vmenter, err := patchText("arch/x86/kvm", "svm/vmenter.S", vmenterFixture, stiVMRUNPatch)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\tsti\n3:\tvmrun %_ASM_AX\n4:\tcli\n", "\tsti\n1:\tvmrun %_ASM_AX\n2:\tcli\n"} {
		if !strings.Contains(vmenter, want) {
			t.Fatalf("patched vmenter.S lacks %q:\n%s", want, vmenter)
		}
	}
	if got, err := patchText("arch/x86/kvm", "svm/pmu.c", "untouched", stiVMRUNPatch); err != nil || got != "untouched" {
		t.Fatalf("a file without patches = %q, %v", got, err)
	}
}

func TestKVMAMDPatchRefusesUnexpectedSource(t *testing.T) {
	// A kernel that already sets IF in assembly (or changed the lines otherwise) must not build.
	changed := strings.Replace(svmFixture, "\traw_local_irq_enable();\n", "", 1)
	_, err := patchText("arch/x86/kvm", "svm/svm.c", changed, stiVMRUNPatch)
	if err == nil || !strings.Contains(err.Error(), "arch/x86/kvm/svm/svm.c") || !strings.Contains(err.Error(), "raw_local_irq_enable") {
		t.Fatalf("missing text: err = %v, want one naming the file and the expected text", err)
	}
	// Twice the expected text is as ambiguous as none.
	_, err = patchText("arch/x86/kvm", "svm/vmenter.S", vmenterFixture+vmenterFixture, stiVMRUNPatch)
	if err == nil || !strings.Contains(err.Error(), "found 2") {
		t.Fatalf("duplicated text: err = %v", err)
	}
}

func TestKVMAMDPackages(t *testing.T) {
	p, err := kvmPackages("6.1.0-57-cloud-amd64", "6.1.192-3")
	if err != nil {
		t.Fatal(err)
	}
	want := kvmSourcePackages{Version: "6.1.192-3", Series: "6.1", Source: "linux-source-6.1",
		Headers: "linux-headers-6.1.0-57-cloud-amd64", Common: "linux-headers-6.1.0-57-common", Kbuild: "linux-kbuild-6.1"}
	if p != want {
		t.Fatalf("kvmPackages = %+v, want %+v", p, want)
	}
	if _, err := kvmPackages("6.1", "6.1.192-3"); err == nil {
		t.Fatal("a release without abi and flavour must be refused")
	}
	if _, err := buildKVMAMD(context.Background(), t.TempDir(), &guestimage.Kernel{}, "nonsense", t.Logf); err == nil || !strings.Contains(err.Error(), KVMAMDSTIVMRUN) {
		t.Fatalf("unknown variant: err = %v, want one listing the variants", err)
	}
}

// testKernel returns the pinned kernel, skipping under -short unless its package is cached already.
func testKernel(t *testing.T) (*guestimage.Kernel, string) {
	t.Helper()
	cache := DefaultCacheDir()
	deb := filepath.Join(cache, "debs", guestimage.KernelPackage+"_"+guestimage.KernelVersion+"_amd64.deb")
	if _, err := os.Stat(deb); err != nil && os.Getenv("CUBE_KERNEL_DEB") == "" && testing.Short() {
		t.Skipf("-short: kernel package %s not cached (%s)", guestimage.KernelPackage, deb)
	}
	k, err := guestimage.FetchKernel(context.Background(), cache)
	if err != nil {
		t.Fatal(err)
	}
	return k, cache
}

func TestKVMAMDStockVermagic(t *testing.T) {
	k, _ := testKernel(t)
	v, err := moduleVermagic(filepath.Join(k.ModulesDir(), stockKVMAMD))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, k.Release+" ") || !strings.Contains(v, "mod_unload") {
		t.Fatalf("vermagic %q does not start with the release %s", v, k.Release)
	}
	if _, err := moduleVermagic("/nonexistent.ko"); err == nil {
		t.Fatal("moduleVermagic of a missing file succeeded")
	}
}

// TestBuildKVMAMD really builds the sti-vmrun module (a few hundred MB of downloads on first use).
func TestBuildKVMAMD(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: rebuilding kvm-amd downloads Debian's linux-source and compiles")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: apt-get download and the test host's cache are set up as root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("needs apt-get to download linux-source and headers")
	}
	k, cache := testKernel(t)
	ctx := context.Background()
	start := time.Now()
	ko, err := buildKVMAMD(ctx, cache, k, KVMAMDSTIVMRUN, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("buildKVMAMD took %s", time.Since(start).Round(100*time.Millisecond))
	stock := filepath.Join(k.ModulesDir(), stockKVMAMD)
	want, err := moduleVermagic(stock)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := moduleVermagic(ko); err != nil || got != want {
		t.Fatalf("vermagic = %q, %v; stock %q", got, err, want)
	}

	// The patched sources are kept beside the module.
	svm, err := os.ReadFile(filepath.Join(filepath.Dir(ko), "svm.c"))
	if err != nil {
		t.Fatal(err)
	}
	fn := string(svm)
	i := strings.Index(fn, "static noinstr void svm_vcpu_enter_exit(")
	if i < 0 {
		t.Fatal("patched svm.c has no svm_vcpu_enter_exit")
	}
	fn = fn[i:]
	fn = fn[:strings.Index(fn, "\n}\n")]
	if strings.Contains(fn, "raw_local_irq_enable()") || strings.Contains(fn, "raw_local_irq_disable()") {
		t.Fatalf("patched svm_vcpu_enter_exit still toggles IF:\n%s", fn)
	}

	// And in the machine code: STI right before each VMRUN, CLI right after, no other STI in the module.
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Log("objdump missing (binutils): machine code not checked")
	} else {
		if n := stiOutsideVMRUN(t, stock, false); n == 0 {
			t.Fatal("stock kvm-amd has no STI outside __svm_*vcpu_run: the check below would prove nothing")
		}
		if n := stiOutsideVMRUN(t, ko, true); n != 0 {
			t.Fatalf("rebuilt kvm-amd has %d STI outside VMRUN's shadow", n)
		}
	}

	// Built once: the second call finds it.
	again, err := buildKVMAMD(ctx, cache, k, KVMAMDSTIVMRUN, t.Logf)
	if err != nil || again != ko {
		t.Fatalf("second buildKVMAMD = %s, %v, want the cached %s", again, err, ko)
	}
	if p, err := buildKVMAMD(ctx, cache, k, KVMAMDStock, t.Logf); err != nil || p != stock {
		t.Fatalf("stock variant = %s, %v, want %s", p, err, stock)
	}
}

// stiOutsideVMRUN disassembles a module and returns how many STI instructions do not directly precede a
// VMRUN. For a patched module it also fails the test unless every VMRUN is STI; VMRUN; CLI.
func stiOutsideVMRUN(t *testing.T, ko string, patched bool) int {
	t.Helper()
	out, err := exec.Command("objdump", "-d", "--no-show-raw-insn", ko).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", ko, err)
	}
	var insns []string // mnemonics, with "" between functions
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasSuffix(l, ">:") {
			insns = append(insns, "")
			continue
		}
		if f := strings.Split(l, "\t"); len(f) >= 2 && strings.HasSuffix(strings.TrimSpace(f[0]), ":") {
			if m := strings.Fields(f[1]); len(m) > 0 {
				insns = append(insns, m[0])
			}
		}
	}
	vmruns, others := 0, 0
	for i, m := range insns {
		switch m {
		case "vmrun":
			vmruns++
			if patched && (i == 0 || insns[i-1] != "sti" || i+1 == len(insns) || insns[i+1] != "cli") {
				t.Errorf("%s: VMRUN %d not between STI and CLI: %v", ko, vmruns, insns[max(0, i-2):min(len(insns), i+3)])
			}
		case "sti":
			if i+1 == len(insns) || insns[i+1] != "vmrun" {
				others++
			}
		}
	}
	if vmruns != 2 {
		t.Errorf("%s: %d VMRUN instructions, want 2 (__svm_vcpu_run, __svm_sev_es_vcpu_run)", ko, vmruns)
	}
	return others
}
