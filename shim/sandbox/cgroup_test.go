package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestPlaceInCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("placing a process in a new cgroup needs root")
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		t.Skip("no /sys/fs/cgroup mounted")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	path := fmt.Sprintf("/cube-shim-test-%d", os.Getpid())
	if err := PlaceInCgroup(path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), path) {
		t.Fatalf("process cgroups:\n%s\nlack %s", b, path)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := RemoveCgroup(path); err != nil {
		t.Fatal(err)
	}
}
