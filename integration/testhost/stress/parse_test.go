package stress

import (
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/integration/testhost"
)

func TestParseLines(t *testing.T) {
	out := "=== RUN TestLifecycles\n" +
		`STRESS {"n":1,"result":"ok","boot_ms":900,"total_ms":2000}` + "\n" +
		"noise STRESS {\n" +
		`STRESS {"n":2,"result":"triple-fault","total_ms":3000,"detail":"x"}` + "\n" +
		`STRESS {"n":3,` + "\n" // cut short by a dying test host
	ls := parseLines([]byte(out))
	if len(ls) != 2 || ls[0].N != 1 || ls[0].BootMS != 900 || ls[1].Result != resultTripleFault {
		t.Fatalf("parsed %+v", ls)
	}
}

func TestKernelFailureKinds(t *testing.T) {
	for _, c := range []struct{ console, kind string }{
		{"[ 1.0] ok\n[ 2.0] BUG: TASK stack guard page was hit at 0000 (stack is ...)\n[ 2.1] Kernel panic - not syncing: Fatal exception in interrupt\n", "stack-guard"},
		{"[ 3.0] Kernel panic - not syncing: corrupted stack end detected inside scheduler\n", "stack-guard"},
		{"[ 5.0] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [cube-vmm:99]\n", "soft-lockup"},
		{"[ 5.0] rcu: INFO: rcu_preempt self-detected stall on CPU\n", "rcu-stall"},
		{"[ 5.0] general protection fault, probably for non-canonical address\n[ 5.1] Kernel panic - not syncing: Fatal exception\n", "oops"},
		{"[ 5.0] Kernel panic - not syncing: Attempted to kill init!\n", "panic"},
		{"[ 1.0] kvm: Unhandled WRMSR(0xc0010007)\n", ""},
	} {
		if k, _ := kernelFailure([]byte(c.console)); k != c.kind {
			t.Errorf("%q: kind %q, want %q", c.console, k, c.kind)
		}
	}
}

func TestSummary(t *testing.T) {
	tl := &tally{lifecycles: 4, results: map[string]int{resultOK: 2, resultKernel: 1, resultStall: 1},
		kernel: map[string]int{"stack-guard": 1}, kernelTotal: 1, hosts: 2, boots: []int64{300, 100, 200}, wall: 90 * time.Second}
	s := tl.summary(testhost.Platform{Accel: "tcg", CPU: "EPYC,+svm", KVMAMD: "stock"}, "host load")
	for _, want := range []string{"kvm-amd=stock, host load | lifecycles 4, ok 2", "kernel failures 1 [stack-guard 1]", "kernel-failed 1, stall 1", "median 200 p90 200 max 300", "test hosts 2", "wall 1m30s"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary %q lacks %q", s, want)
		}
	}
}
