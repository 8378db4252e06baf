package container

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ErrInvalid marks errors caused by a bad spec or request (as opposed to a
// failure of the guest). Test with errors.Is.
var ErrInvalid = errors.New("invalid")

// ErrNotFound marks errors about something that does not exist (a command,
// a path in the rootfs).
var ErrNotFound = errors.New("not found")

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

const maxSpecBytes = 1 << 20

// DecodeSpec parses and validates a JSON OCI runtime spec.
func DecodeSpec(data []byte) (*specs.Spec, error) {
	if len(data) > maxSpecBytes {
		return nil, invalidf("spec is %d bytes, larger than %d", len(data), maxSpecBytes)
	}
	var s specs.Spec
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&s); err != nil {
		return nil, invalidf("decode OCI spec: %v", err)
	}
	if err := ValidateSpec(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DecodeProcess parses and validates a JSON OCI process (for exec).
func DecodeProcess(data []byte) (*specs.Process, error) {
	if len(data) > maxSpecBytes {
		return nil, invalidf("process is %d bytes, larger than %d", len(data), maxSpecBytes)
	}
	var p specs.Process
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, invalidf("decode OCI process: %v", err)
	}
	if err := ValidateProcess(&p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Namespace clone flags of the namespace types we can create.
var namespaceFlags = map[specs.LinuxNamespaceType]uintptr{
	specs.PIDNamespace:     unix.CLONE_NEWPID,
	specs.NetworkNamespace: unix.CLONE_NEWNET,
	specs.MountNamespace:   unix.CLONE_NEWNS,
	specs.IPCNamespace:     unix.CLONE_NEWIPC,
	specs.UTSNamespace:     unix.CLONE_NEWUTS,
	specs.CgroupNamespace:  unix.CLONE_NEWCGROUP,
}

// ValidateSpec checks what this runtime relies on and rejects what it cannot
// honour, with a message naming the offending field.
func ValidateSpec(s *specs.Spec) error {
	if s.Process == nil {
		return invalidf("spec.process is missing")
	}
	if err := ValidateProcess(s.Process); err != nil {
		return err
	}
	if s.Root != nil && s.Root.Path != "" && !path.IsAbs(s.Root.Path) {
		// Relative roots are relative to a bundle, which the guest has none of.
		return invalidf("spec.root.path %q is not absolute", s.Root.Path)
	}
	if len(s.Hostname) > 64 {
		return invalidf("spec.hostname is %d bytes, longer than 64", len(s.Hostname))
	}
	if s.Linux == nil {
		return invalidf("spec.linux is missing")
	}
	seen := map[specs.LinuxNamespaceType]bool{}
	for i, ns := range s.Linux.Namespaces {
		if seen[ns.Type] {
			return invalidf("spec.linux.namespaces[%d]: namespace %q listed twice", i, ns.Type)
		}
		seen[ns.Type] = true
		switch ns.Type {
		case specs.UserNamespace, specs.TimeNamespace:
			return invalidf("spec.linux.namespaces[%d]: %s namespaces are not supported", i, ns.Type)
		case specs.MountNamespace:
			if ns.Path != "" {
				return invalidf("spec.linux.namespaces[%d]: joining an existing mount namespace is not supported", i)
			}
		default:
			if _, ok := namespaceFlags[ns.Type]; !ok {
				return invalidf("spec.linux.namespaces[%d]: unknown namespace type %q", i, ns.Type)
			}
		}
		if ns.Path != "" && !path.IsAbs(ns.Path) {
			return invalidf("spec.linux.namespaces[%d]: path %q is not absolute", i, ns.Path)
		}
	}
	if !seen[specs.MountNamespace] {
		// pivot_root without a private mount namespace would move the
		// agent's own root.
		return invalidf("spec.linux.namespaces must include a mount namespace")
	}
	if s.Hostname != "" && !seen[specs.UTSNamespace] {
		return invalidf("spec.hostname is set but there is no uts namespace")
	}
	for i, m := range s.Mounts {
		if !path.IsAbs(m.Destination) {
			return invalidf("spec.mounts[%d]: destination %q is not absolute", i, m.Destination)
		}
		if m.Type == "" && !hasBind(m.Options) {
			return invalidf("spec.mounts[%d] (%s): no type and no bind option", i, m.Destination)
		}
		if strings.ContainsRune(m.Destination, 0) || strings.ContainsRune(m.Source, 0) {
			return invalidf("spec.mounts[%d]: NUL byte in path", i)
		}
	}
	for i, d := range s.Linux.Devices {
		if !path.IsAbs(d.Path) {
			return invalidf("spec.linux.devices[%d]: path %q is not absolute", i, d.Path)
		}
		if _, err := deviceType(d.Type); err != nil {
			return invalidf("spec.linux.devices[%d]: %v", i, err)
		}
	}
	for k := range s.Linux.Sysctl {
		if k == "" || strings.Contains(k, "..") || strings.ContainsAny(k, "/\x00") && !strings.Contains(k, ".") {
			return invalidf("spec.linux.sysctl: bad key %q", k)
		}
	}
	switch s.Linux.RootfsPropagation {
	case "", "private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable":
	default:
		return invalidf("spec.linux.rootfsPropagation %q is unknown", s.Linux.RootfsPropagation)
	}
	return nil
}

// ValidateProcess checks an OCI process.
func ValidateProcess(p *specs.Process) error {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return invalidf("process.args is empty")
	}
	if p.Cwd == "" || !path.IsAbs(p.Cwd) {
		return invalidf("process.cwd %q is not an absolute path", p.Cwd)
	}
	for _, a := range p.Args {
		if strings.ContainsRune(a, 0) {
			return invalidf("process.args contains a NUL byte")
		}
	}
	for i, e := range p.Env {
		if !strings.Contains(e, "=") || strings.HasPrefix(e, "=") || strings.ContainsRune(e, 0) {
			return invalidf("process.env[%d] %q is not KEY=value", i, e)
		}
	}
	for i, r := range p.Rlimits {
		if _, ok := rlimitResources[r.Type]; !ok {
			return invalidf("process.rlimits[%d]: unknown type %q", i, r.Type)
		}
		if r.Soft > r.Hard {
			return invalidf("process.rlimits[%d] (%s): soft limit %d above hard limit %d", i, r.Type, r.Soft, r.Hard)
		}
	}
	if err := validateCapabilities(p.Capabilities); err != nil {
		return err
	}
	if p.ConsoleSize != nil && (p.ConsoleSize.Width > 0xffff || p.ConsoleSize.Height > 0xffff) {
		return invalidf("process.consoleSize %dx%d out of range", p.ConsoleSize.Width, p.ConsoleSize.Height)
	}
	return nil
}

var rlimitResources = map[string]int{
	"RLIMIT_AS":         unix.RLIMIT_AS,
	"RLIMIT_CORE":       unix.RLIMIT_CORE,
	"RLIMIT_CPU":        unix.RLIMIT_CPU,
	"RLIMIT_DATA":       unix.RLIMIT_DATA,
	"RLIMIT_FSIZE":      unix.RLIMIT_FSIZE,
	"RLIMIT_LOCKS":      unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK":    unix.RLIMIT_MEMLOCK,
	"RLIMIT_MSGQUEUE":   unix.RLIMIT_MSGQUEUE,
	"RLIMIT_NICE":       unix.RLIMIT_NICE,
	"RLIMIT_NOFILE":     unix.RLIMIT_NOFILE,
	"RLIMIT_NPROC":      unix.RLIMIT_NPROC,
	"RLIMIT_RSS":        unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO":     unix.RLIMIT_RTPRIO,
	"RLIMIT_RTTIME":     unix.RLIMIT_RTTIME,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK":      unix.RLIMIT_STACK,
}

func deviceType(t string) (uint32, error) {
	switch t {
	case "c", "u":
		return unix.S_IFCHR, nil
	case "b":
		return unix.S_IFBLK, nil
	case "p":
		return unix.S_IFIFO, nil
	}
	return 0, fmt.Errorf("unknown device type %q", t)
}

func hasBind(opts []string) bool {
	for _, o := range opts {
		if o == "bind" || o == "rbind" {
			return true
		}
	}
	return false
}

// CloneFlags returns the clone flags for the namespaces the spec asks to
// create (those without a path).
func CloneFlags(s *specs.Spec) uintptr {
	var f uintptr
	for _, ns := range s.Linux.Namespaces {
		if ns.Path == "" {
			f |= namespaceFlags[ns.Type]
		}
	}
	return f
}

// NewNetns reports whether the spec asks for a new network namespace (one
// without a path). Without a network namespace entry the container shares
// the agent's, the guest's initial one.
func NewNetns(s *specs.Spec) bool {
	return s != nil && s.Linux != nil && CloneFlags(s)&unix.CLONE_NEWNET != 0
}
