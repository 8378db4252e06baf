package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/sandbox/sandboxtest"
)

func TestConsoleTail(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "console.log")
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "line %d\r\n", i)
	}
	b.WriteString("\n\n")
	os.WriteFile(p, []byte(b.String()), 0o600)
	got, err := sandbox.ConsoleTail(p, 3)
	if err != nil || strings.Join(got, "|") != "line 97|line 98|line 99" {
		t.Fatalf("ConsoleTail = %q, %v", got, err)
	}
	os.WriteFile(p, nil, 0o600)
	if got, err := sandbox.ConsoleTail(p, 3); err != nil || len(got) != 0 {
		t.Errorf("empty console: %q, %v", got, err)
	}
	if _, err := sandbox.ConsoleTail(filepath.Join(dir, "missing"), 3); err == nil {
		t.Error("a missing console log: no error")
	}
	// A long console: only its end is read.
	os.WriteFile(p, []byte(strings.Repeat("x", 200<<10)+"\nlast\n"), 0o600)
	if got, _ := sandbox.ConsoleTail(p, 1); len(got) != 1 || got[0] != "last" {
		t.Errorf("long console: %q", got)
	}
}

// A VMM that dies under a running sandbox: the shim's log gets the guest console's last lines before the
// state dir (and console.log with it) is removed; a sandbox that fails to start likewise.
func TestConsoleTailLoggedWhenTheVMDies(t *testing.T) {
	for _, c := range []struct {
		name  string
		start bool // the VM started; else its agent never answers
	}{{"died", true}, {"failed start", false}} {
		t.Run(c.name, func(t *testing.T) {
			var logged strings.Builder
			log := logrus.New()
			log.SetOutput(&logged)
			agent := sandboxtest.NewAgent()
			vmm := sandboxtest.NewVMM(agent)
			dir := filepath.Join(t.TempDir(), "sb")
			dial := sandboxtest.Dialer(agent)
			if !c.start {
				dial = func(ctx context.Context, v sandbox.VMM) (sandbox.AgentClient, error) {
					// The guest wrote its last words and stopped answering.
					os.WriteFile(filepath.Join(dir, "console.log"), []byte("early boot\nlast words before the hang\n"), 0o600)
					return nil, errors.New("connection refused")
				}
			}
			sb, err := sandbox.New(sandbox.Options{ID: "sb1", Dir: dir, DiskSlots: 1, VMM: vmm, Dial: dial,
				BootTimeout: 200 * time.Millisecond, Log: logrus.NewEntry(log)})
			if err != nil {
				t.Fatal(err)
			}
			err = sb.Start(context.Background(), "/img/c1.ext4", "c1")
			if c.start {
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(dir, "console.log"), []byte("boot\nKernel said goodbye\n"), 0o600)
				vmm.Crash()
				<-sb.Done()
			} else if err == nil {
				t.Fatal("Start succeeded without an agent")
			}
			want := map[bool]string{true: "Kernel said goodbye", false: "last words before the hang"}[c.start]
			if !strings.Contains(logged.String(), "sb1 console: "+want) {
				t.Errorf("shim log lacks the console tail %q:\n%s", want, logged.String())
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("state dir left: %v", err)
			}
		})
	}
}
