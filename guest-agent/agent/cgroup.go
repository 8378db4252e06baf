package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Each container gets a cgroup2 directory under Config.CgroupRoot. Its
// processes are forked straight into it (clone3 CLONE_INTO_CGROUP), so
// every descendant stays accounted for even when it daemonizes and is
// reparented to the agent: ListPids, Signal(all) and force Delete use it.

// cgroupRootUsable checks that root's parent is a cgroup2 mount and creates
// root. An empty string means: no cgroups (fall back to the process tree).
func cgroupRootUsable(root string) (string, error) {
	if root == "" || root == "-" {
		return "", nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(root), &st); err != nil {
		return "", fmt.Errorf("cgroup root %s: %w", root, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("cgroup root %s: parent is not a cgroup2 mount", root)
	}
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("cgroup root %s: %w", root, err)
	}
	return root, nil
}

type cgroup struct {
	path string
	fd   int // O_DIRECTORY fd for CLONE_INTO_CGROUP
}

func newCgroup(root, id string) (*cgroup, error) {
	p := filepath.Join(root, id)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", p, err)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Rmdir(p)
		return nil, fmt.Errorf("open cgroup %s: %w", p, err)
	}
	return &cgroup{path: p, fd: fd}, nil
}

// pids lists the processes in the cgroup (pids of the agent's namespace).
func (c *cgroup) pids() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read %s/cgroup.procs: %w", c.path, err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out, nil
}

// kill SIGKILLs everything in the cgroup: cgroup.kill does it atomically
// (no fork can escape), signalling each pid is the fallback.
func (c *cgroup) kill() {
	if err := os.WriteFile(filepath.Join(c.path, "cgroup.kill"), []byte("1"), 0); err == nil {
		return
	}
	pids, _ := c.pids()
	for _, p := range pids {
		unix.Kill(p, unix.SIGKILL)
	}
}

// remove deletes the cgroup once its last process is gone. Orphans are
// reaped asynchronously, so an EBUSY is retried for a bounded while.
func (c *cgroup) remove() error {
	unix.Close(c.fd)
	var err error
	for i := 0; i < 200; i++ {
		if err = unix.Rmdir(c.path); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", c.path, err)
}
