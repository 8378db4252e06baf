package container

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// InitArg0 is argv[0] of the helper; MaybeRunInit recognises it.
const InitArg0 = "cube-container-init"

// Helper file descriptors (ExtraFiles order).
const (
	configFd = 3 // InitConfig JSON, parent → helper
	statusFd = 4 // statusMsg JSON lines, helper → parent; closed by execve
	startFd  = 5 // one byte parent → helper: go ahead and execve
	// consoleFd (terminal processes only) is a socket on which the helper
	// sends the master of the pty it opened in the container (SCM_RIGHTS).
	consoleFd = 6
)

// Mode says whether the helper sets up a new container or joins one.
type Mode string

const (
	ModeCreate Mode = "create"
	ModeExec   Mode = "exec"
)

// NsJoin names a namespace to enter with setns(2).
type NsJoin struct {
	Type specs.LinuxNamespaceType `json:"type"`
	Path string                   `json:"path"`
}

// InitConfig is everything the helper needs, sent on configFd.
type InitConfig struct {
	Mode    Mode           `json:"mode"`
	Rootfs  string         `json:"rootfs,omitempty"`
	Spec    *specs.Spec    `json:"spec,omitempty"`
	Process *specs.Process `json:"process"`
	// Join: namespaces to enter (exec, or create with namespace paths),
	// except pid, which the parent enters before forking.
	Join []NsJoin `json:"join,omitempty"`
}

// statusMsg is one line on the status pipe.
type statusMsg struct {
	Stage string `json:"stage"` // "ready" or "error"
	Error string `json:"error,omitempty"`
	// Kind: "invalid", "notfound" or "" (internal).
	Kind string `json:"kind,omitempty"`
	// RootSwitch: how the rootfs became / ("pivot_root", or "move+chroot"
	// when / was an initramfs); empty for exec.
	RootSwitch string `json:"root_switch,omitempty"`
	// LoopbackUp: the container has a network namespace of its own, and
	// the helper brought its lo up.
	LoopbackUp bool `json:"loopback_up,omitempty"`
	// EnteredNS is CLOCK_MONOTONIC when the helper's main began (after
	// execve and the Go runtime's start); StagesMS what its steps took
	// ("ready" only): the agent logs both.
	EnteredNS int64  `json:"entered_ns,omitempty"`
	StagesMS  string `json:"stages_ms,omitempty"`
}
