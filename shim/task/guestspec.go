package task

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
	"github.com/cube-runtime/cube/shim/volume"
)

// A container spec from containerd names host resources the guest cannot
// see. CRI's are the common case: /etc/hosts, /etc/hostname and
// /etc/resolv.conf bind-mounted from files in the sandbox's host state dir,
// the kubelet's volumes bind-mounted from its pod directory, /dev/shm from
// a host tmpfs, and a pod member joins the pod's namespaces through
// /proc/<sandbox pid>/ns/… where the sandbox pid is the VMM's host pid (the
// pid this shim reports). guestSpec rewrites those into their guest
// equivalents:
//   - host bind mounts as volumes.go says (emptyDir in the VM, copied and
//     synced configMap/secret/projected/downwardAPI trees and host files,
//     /dev/shm a tmpfs, other host directories refused);
//   - /proc/<VMM pid>/ns/<type> becomes /proc/<guest pid of the sandbox
//     container>/ns/<type>; a network namespace path from the host (CNI's
//     netns) is dropped, so the pod gets a network namespace of its own in
//     the guest; other host namespace paths are refused.

var procNSPath = regexp.MustCompile(`^/proc/([0-9]+)/ns/([a-z]+)$`)

// specEnv is what guestSpec needs to know about the sandbox.
type specEnv struct {
	containerID string
	vmmPid      int
	// sandboxGuestPid is the guest pid of the sandbox (pause) container's
	// init, 0 when this shim does not run it.
	sandboxGuestPid uint32
	// guestNetwork: the VM has a NIC from the host (a CRI pod's CNI
	// network), configured in the guest's initial network namespace.
	guestNetwork bool
	// sandboxRoot is the guest mount point of the sandbox container's
	// rootfs disk, where emptyDir volumes live ("" if unknown).
	sandboxRoot string
	agent       guestVolumes
	shares      hostShares
	volumes     *volume.Syncer
	log         logrus.FieldLogger
	// use collects what the container's mounts hold in the guest.
	use *volumeUse
}

// guestSpec returns raw (a spec already carrying the guest root) with host
// mounts and namespace paths translated; unknown fields pass through.
func guestSpec(ctx context.Context, raw []byte, env specEnv) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("parse OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if m, ok := fields["mounts"]; ok {
		var mounts []specs.Mount
		if err := json.Unmarshal(m, &mounts); err != nil {
			return nil, fmt.Errorf("parse OCI spec mounts: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		for i := range mounts {
			if err := guestMount(ctx, &mounts[i], i, env); err != nil {
				return nil, err
			}
		}
		b, err := json.Marshal(mounts)
		if err != nil {
			return nil, err
		}
		fields["mounts"] = b
	}
	if l, ok := fields["linux"]; ok {
		var linux map[string]json.RawMessage
		if err := json.Unmarshal(l, &linux); err != nil {
			return nil, fmt.Errorf("parse OCI spec linux: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if n, ok := linux["namespaces"]; ok {
			var nss []specs.LinuxNamespace
			if err := json.Unmarshal(n, &nss); err != nil {
				return nil, fmt.Errorf("parse OCI spec namespaces: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			nss = shareGuestNetwork(nss, env)
			for i := range nss {
				if err := guestNamespace(&nss[i], env); err != nil {
					return nil, err
				}
			}
			b, err := json.Marshal(nss)
			if err != nil {
				return nil, err
			}
			linux["namespaces"] = b
			if fields["linux"], err = json.Marshal(linux); err != nil {
				return nil, err
			}
		}
	}
	return json.Marshal(fields)
}

func isBind(m *specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

func guestNamespace(ns *specs.LinuxNamespace, env specEnv) error {
	if ns.Path == "" {
		return nil
	}
	if m := procNSPath.FindStringSubmatch(ns.Path); m != nil {
		if pid, _ := strconv.Atoi(m[1]); pid == env.vmmPid && pid != 0 {
			if env.sandboxGuestPid == 0 {
				return fmt.Errorf("%s namespace %s names the sandbox VM, but its sandbox container does not run in it: %w",
					ns.Type, ns.Path, errdefs.ErrFailedPrecondition)
			}
			ns.Path = fmt.Sprintf("/proc/%d/ns/%s", env.sandboxGuestPid, m[2])
			return nil
		}
	}
	if ns.Type == specs.NetworkNamespace {
		// A host network namespace (CNI's) cannot be entered from the guest;
		// the pod's containers share a fresh one inside the VM instead.
		if env.log != nil {
			env.log.WithField("path", ns.Path).Warn("host network namespace ignored: the VM has no NIC from it, so the pod gets its own network namespace in the VM (loopback only)")
		}
		ns.Path = ""
		return nil
	}
	return fmt.Errorf("%s namespace path %s is on the host; a VM's containers can only join namespaces of their own sandbox: %w",
		ns.Type, ns.Path, errdefs.ErrInvalidArgument)
}

// translateSpec is guestSpec for container id of sandbox sandboxID in sb,
// whose rootfs is mounted at guestRoot; use collects its volumes.
func (s *Service) translateSpec(ctx context.Context, sb *sandbox.Sandbox, id, sandboxID, guestRoot string, raw []byte, use *volumeUse) ([]byte, error) {
	env := specEnv{containerID: id, vmmPid: sb.Pid(), agent: sb.Agent(), guestNetwork: sb.HasNetwork(),
		log: s.o.Log.WithField("container", id), use: use, sandboxRoot: guestRoot, shares: sb}
	s.mu.Lock()
	if c := s.containers[sandboxID]; c != nil && c.init != nil && sandboxID != id {
		env.sandboxGuestPid = c.init.GuestPid()
		env.sandboxRoot = c.guestRoot
	}
	env.volumes = s.volumes
	s.mu.Unlock()
	return guestSpec(ctx, raw, env)
}

// shareGuestNetwork drops a host network namespace path (CNI's), or a new
// namespace (the hooks' one, see below), from nss when the VM has the pod's
// network: the agent configured the NIC in the
// guest's initial network namespace, so the sandbox container stays in it
// (as a host-network pod's does) and the pod's other containers, which join
// the sandbox container's namespace (/proc/<VMM pid>/ns/net), share it.
// Without a network from the host, guestNamespace gives the pod a fresh
// namespace of its own instead (loopback only).
func shareGuestNetwork(nss []specs.LinuxNamespace, env specEnv) []specs.LinuxNamespace {
	if !env.guestNetwork {
		return nss
	}
	return slices.DeleteFunc(nss, func(ns specs.LinuxNamespace) bool {
		// A new namespace (no path) in a VM with a network is the one the
		// network hooks were given on the host (podnet.HookNetwork): the
		// container gets the guest's, where its NIC is. (A CRI pod's
		// containers with a network name a path: CNI's or the sandbox's.)
		if ns.Type != specs.NetworkNamespace || procNSPath.MatchString(ns.Path) {
			return false
		}
		if env.log != nil {
			env.log.WithField("path", ns.Path).Debug("host network namespace replaced by the guest's, where the pod's NIC is")
		}
		return true
	})
}
