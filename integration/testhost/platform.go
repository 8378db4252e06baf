package testhost

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Platform is the emulated machine and the KVM inside it: what the stability measurements vary (README "Known
// problems", `make stress`). Every field has an environment variable, so a whole e2e run can try a candidate
// (CUBE_TESTHOST_CPU=EPYC-Rome,+svm,+npt make e2e). The zero value means the defaults below.
type Platform struct {
	// Accel is QEMU's -accel (CUBE_TESTHOST_ACCEL; default DefaultAccel).
	Accel string
	// CPU is QEMU's -cpu model with its feature flags (CUBE_TESTHOST_CPU; default DefaultCPU).
	CPU string
	// Append is added to the test host's kernel command line (CUBE_TESTHOST_APPEND).
	Append string
	// ModuleParams are parameters for the test host's modules as on a kernel command line:
	// "kvm_amd.npt=0 kvm.tdp_mmu=0" (CUBE_TESTHOST_MODPARAMS). insmod gets them; unknown modules are refused.
	ModuleParams string
	// KVMAMD is which kvm-amd.ko the test host loads: KVMAMDStock or KVMAMDSTIVMRUN
	// (CUBE_TESTHOST_KVM_AMD; default DefaultKVMAMD).
	KVMAMD string
	// QEMU is which emulator runs the test host: QEMUPatched or QEMUDebian (CUBE_TESTHOST_QEMU; default
	// DefaultQEMU). $CUBE_QEMU, when set, names the binary of either and skips the build.
	QEMU string
}

// Platform defaults: what `make test` and CI use.
const (
	DefaultAccel = "tcg,thread=multi"
	DefaultCPU   = "EPYC,+svm,+npt"
	// DefaultKVMAMD: the package's own module. The rebuilt sti-vmrun one was measured and did not reduce the
	// test host's kernel failures (docs/testhost.md).
	DefaultKVMAMD = KVMAMDStock
	// DefaultQEMU: the packaged binary. The patched build (QEMUPatched) crashed the test host's kernel too,
	// less often in the measurements so far but not yet shown to be better (docs/testhost.md).
	DefaultQEMU = QEMUDebian
)

// Environment variables of the Platform fields and of the test host's vCPU count.
const (
	EnvAccel        = "CUBE_TESTHOST_ACCEL"
	EnvCPU          = "CUBE_TESTHOST_CPU"
	EnvAppend       = "CUBE_TESTHOST_APPEND"
	EnvModuleParams = "CUBE_TESTHOST_MODPARAMS"
	EnvKVMAMD       = "CUBE_TESTHOST_KVM_AMD"
	EnvSMP          = "CUBE_TESTHOST_SMP"
	EnvQEMUVariant  = "CUBE_TESTHOST_QEMU"
)

// withDefaults fills empty fields from the environment, then from the defaults.
func (p Platform) withDefaults() Platform {
	pick := func(v *string, env, def string) {
		if *v == "" {
			*v = os.Getenv(env)
		}
		if *v == "" {
			*v = def
		}
	}
	pick(&p.Accel, EnvAccel, DefaultAccel)
	pick(&p.CPU, EnvCPU, DefaultCPU)
	pick(&p.Append, EnvAppend, "")
	pick(&p.ModuleParams, EnvModuleParams, "")
	pick(&p.KVMAMD, EnvKVMAMD, DefaultKVMAMD)
	pick(&p.QEMU, EnvQEMUVariant, DefaultQEMU)
	return p
}

// String is the platform as one line, for logs and the stress summary.
func (p Platform) String() string {
	s := fmt.Sprintf("qemu=%s accel=%s cpu=%s kvm-amd=%s", p.QEMU, p.Accel, p.CPU, p.KVMAMD)
	if p.Append != "" {
		s += fmt.Sprintf(" append=%q", p.Append)
	}
	if p.ModuleParams != "" {
		s += fmt.Sprintf(" modparams=%q", p.ModuleParams)
	}
	return s
}

func (p Platform) validate() error {
	if p.KVMAMD != KVMAMDStock && p.KVMAMD != KVMAMDSTIVMRUN {
		return fmt.Errorf("test host kvm-amd variant %q (Platform.KVMAMD, %s): want %q or %q", p.KVMAMD, EnvKVMAMD, KVMAMDStock, KVMAMDSTIVMRUN)
	}
	if !strings.Contains(p.CPU, "svm") && !strings.HasPrefix(p.CPU, "host") {
		return fmt.Errorf("test host CPU %q (Platform.CPU, %s) has no +svm: nested KVM needs an AMD-V CPU model, e.g. %q", p.CPU, EnvCPU, DefaultCPU)
	}
	if _, err := parseModuleParams(p.ModuleParams); err != nil {
		return err
	}
	if p.QEMU != QEMUPatched && p.QEMU != QEMUDebian {
		return fmt.Errorf("test host QEMU variant %q (Platform.QEMU, %s): want %q (Debian's source with our nested-SVM fixes, built once) or %q (the packaged binary)", p.QEMU, EnvQEMUVariant, QEMUPatched, QEMUDebian)
	}
	return nil
}

var modParamRE = regexp.MustCompile(`^([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)=([^\s'"]*)$`)

// parseModuleParams turns "kvm_amd.npt=0 kvm.tdp_mmu=0" into module name (underscores) → "npt=0 ..." lines.
func parseModuleParams(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		m := modParamRE.FindStringSubmatch(f)
		if m == nil {
			return nil, fmt.Errorf("test host module parameter %q (%s): want MODULE.PARAM=VALUE, e.g. kvm_amd.npt=0", f, EnvModuleParams)
		}
		mod := strings.ReplaceAll(m[1], "-", "_")
		out[mod] = strings.TrimSpace(out[mod] + " " + m[2] + "=" + m[3])
	}
	return out, nil
}

// moduleParamsFile is /cube/modparams: "MODULE PARAM=VALUE ..." lines that stage 2 passes to insmod. Every
// module named must be one the test host loads (mods are paths like kernel/arch/x86/kvm/kvm-amd.ko).
func moduleParamsFile(s string, mods []string) ([]byte, error) {
	params, err := parseModuleParams(s)
	if err != nil {
		return nil, err
	}
	loaded := map[string]bool{}
	for _, m := range mods {
		loaded[moduleName(m)] = true
	}
	var names []string
	for n := range params {
		if !loaded[n] {
			return nil, fmt.Errorf("test host module parameter for %s (%s): the test host does not load that module (add it to Options.Modules)", n, EnvModuleParams)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s %s\n", n, params[n])
	}
	return []byte(b.String()), nil
}

// moduleName is a module file's name as the kernel spells it: kernel/arch/x86/kvm/kvm-amd.ko → kvm_amd.
func moduleName(path string) string {
	base := path[strings.LastIndexByte(path, '/')+1:]
	return strings.ReplaceAll(strings.TrimSuffix(base, ".ko"), "-", "_")
}

// smpFromEnv is CUBE_TESTHOST_SMP as a vCPU count, 0 when unset.
func smpFromEnv() (int, error) {
	v := os.Getenv(EnvSMP)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 64 {
		return 0, fmt.Errorf("%s=%q: want a number of test-host vCPUs from 1 to 64", EnvSMP, v)
	}
	return n, nil
}
