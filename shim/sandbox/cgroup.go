package sandbox

import (
	"fmt"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// PlaceInCgroup moves pid (the VMM, so all its vCPU and device threads) into
// the cgroup at path, creating it when absent. path is a cgroup v1 path
// ("/cube/sb1", applied to every mounted hierarchy) or a v2 group.
func PlaceInCgroup(path string, pid int) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.NewManager("/sys/fs/cgroup", path, &cgroup2.Resources{})
		if err != nil {
			return fmt.Errorf("cgroup v2 %s: %w", path, err)
		}
		return m.AddProc(uint64(pid))
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		cg, err = cgroup1.New(cgroup1.StaticPath(path), &specs.LinuxResources{})
		if err != nil {
			return fmt.Errorf("cgroup v1 %s: %w", path, err)
		}
	}
	return cg.AddProc(uint64(pid))
}

// RemoveCgroup deletes the cgroup at path (it must hold no process).
func RemoveCgroup(path string) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path)
		if err != nil {
			return err
		}
		return m.Delete()
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return err
	}
	return cg.Delete()
}

// CgroupMetrics returns the cgroup's statistics (cgroup v1 or v2 metrics
// message, as containerd's runc shim returns them from Stats).
func CgroupMetrics(path string) (any, error) {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path)
		if err != nil {
			return nil, fmt.Errorf("load cgroup %s: %w", path, err)
		}
		return m.Stat()
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", path, err)
	}
	return cg.Stat(cgroup1.IgnoreNotExist)
}
