package testhost

import (
	"strings"
	"testing"
)

// The lines the patches replace, as they stand in QEMU 10.0.2 (only the replaced text: the test checks that
// each patch finds its text exactly once and what the result says).
const (
	svmHelperFixture = `#include "exec/cpu_ldst.h"
#include "tcg/helper-tcg.h"

    env->hflags2 |= HF2_GIF_MASK;

    if (ctl_has_irq(env)) {
        cs->interrupt_request |= CPU_INTERRUPT_VIRQ;
    }

        switch (event_inj & SVM_EVTINJ_TYPE_MASK) {
        case SVM_EVTINJ_TYPE_INTR:
            cs->exception_index = vector;
            /* XXX: is it always correct? */
            do_interrupt_x86_hardirq(env, vector, 1);
            break;
        case SVM_EVTINJ_TYPE_NMI:
`
	mesonFixture = `  if target in target_dirs
    bzip2 = find_program('bzip2', required: get_option('install_blobs'))
    unpack_edk2_blobs = bzip2.found()
    break
`
)

func TestQEMUPatchesApply(t *testing.T) {
	svm, err := patchText("qemu", "target/i386/tcg/system/svm_helper.c", svmHelperFixture, qemuPatches)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"#include \"qemu/main-loop.h\"\n",
		"        BQL_LOCK_GUARD();\n        cs->interrupt_request |= CPU_INTERRUPT_VIRQ;\n",
		"do_interrupt_x86_hardirq(env, vector, 1);\n            /* cube: delivered; do not leave it pending to be delivered again. */\n            cs->exception_index = -1;\n            break;\n",
	} {
		if !strings.Contains(svm, want) {
			t.Errorf("patched svm_helper.c lacks %q:\n%s", want, svm)
		}
	}
	meson, err := patchText("qemu", "meson.build", mesonFixture, qemuPatches)
	if err != nil || !strings.Contains(meson, "unpack_edk2_blobs = false\n") {
		t.Fatalf("patched meson.build = %q, %v", meson, err)
	}
}

func TestQEMUPatchesRefuseOtherSource(t *testing.T) {
	// A QEMU whose helper_vmrun already resets exception_index (or changed otherwise) must not build
	// silently unpatched.
	changed := strings.Replace(svmHelperFixture, "            do_interrupt_x86_hardirq(env, vector, 1);\n            break;\n", "            do_interrupt_x86_hardirq(env, vector, 1);\n            cs->exception_index = -1;\n            break;\n", 1)
	_, err := patchText("qemu-10.0.2", "target/i386/tcg/system/svm_helper.c", changed, qemuPatches)
	if err == nil || !strings.Contains(err.Error(), "qemu-10.0.2/target/i386/tcg/system/svm_helper.c") || !strings.Contains(err.Error(), "found 0") {
		t.Fatalf("changed source: err = %v, want one naming the file and the count", err)
	}
}

func TestQEMUKey(t *testing.T) {
	a := qemuKey("gcc (Debian 12.2.0-14) 12.2.0")
	if a != qemuKey("gcc (Debian 12.2.0-14) 12.2.0") || len(a) != 16 {
		t.Fatalf("key %q is not a stable 16-digit hash", a)
	}
	if a == qemuKey("gcc (Debian 13.1.0-1) 13.1.0") {
		t.Fatal("another compiler must give another key")
	}
	saved := qemuPatches
	t.Cleanup(func() { qemuPatches = saved })
	qemuPatches = qemuPatches[:len(qemuPatches)-1]
	if a == qemuKey("gcc (Debian 12.2.0-14) 12.2.0") {
		t.Fatal("other patches must give another key")
	}
}

func TestQEMUSourcePinned(t *testing.T) {
	if !strings.HasSuffix(qemuSource.URL, "/"+qemuSource.File) || len(qemuSource.SHA256) != 64 || !strings.HasPrefix(qemuSource.File, "qemu_"+qemuSource.Version+"+") {
		t.Fatalf("inconsistent pin: %+v", qemuSource)
	}
}
