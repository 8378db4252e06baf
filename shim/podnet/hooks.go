package podnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/egress"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// HookNetwork is the network of a container that is not a CRI pod's but
// whose spec asks for a network namespace of its own (no path) and carries
// prestart or createRuntime hooks: how containerd clients other than CRI
// set up networking for runc (nerdctl's `nerdctl internal oci-hook
// createRuntime` runs CNI; any hook may). runc runs those hooks on the host
// with the OCI state on stdin, whose pid names a process in the container's
// network namespace. For a VM the shim does the same with a namespace of
// its own on the host:
//
//  1. a locked OS thread of the shim unshares a new network namespace and
//     holds it; the state's pid is that thread's id (/proc/<tid>/ns/net is
//     the namespace, as /proc/<pid>/ns/net is a runc container's);
//  2. the prestart, then createRuntime hooks run (runc's order) with the
//     state (status "creating"), each within its timeout;
//  3. the namespace, now with what the hooks made (CNI's veth and
//     addresses), is attached like a CRI pod's (Network): the VM's tap
//     redirected to and from the interface, its addresses and routes given
//     to the guest;
//  4. at Detach (the VMM gone), the redirects go, the poststop hooks run
//     (status "stopped": CNI DEL), and the thread ends, taking the
//     namespace with it.
//
// createContainer and startContainer hooks run in the container's
// namespaces, which are in the guest: they are not run (logged).
type HookNetwork struct {
	ID, Bundle string
	Spec       *specs.Spec
	// HostNetNS and Initial are as Network's.
	HostNetNS string
	Initial   *egress.Policy
	Log       *logrus.Entry

	mu     sync.Mutex
	holder *nsHolder
	net    *Network
}

var _ sandbox.Network = (*HookNetwork)(nil)
var _ sandbox.EgressNetwork = (*HookNetwork)(nil)
var _ sandbox.NICCounter = (*HookNetwork)(nil)

// NICCount implements sandbox.NICCounter: the hooks' namespace is attached
// as a pod's (Network), one NIC.
func (n *HookNetwork) NICCount() int { return 1 }

// HooksFromSpec returns the hook network of container id's spec, or nil
// (no error) when the VM gets none from hooks: no prestart or
// createRuntime hook, no network namespace of its own (`ctr run
// --net-host`: the hooks are not run, as there is no namespace to give
// them), or a namespace path (CRI's, or joined by hand).
func HooksFromSpec(id, bundle string, spec *specs.Spec, log *logrus.Entry) (*HookNetwork, error) {
	if spec == nil || spec.Hooks == nil || spec.Linux == nil {
		return nil, nil
	}
	h := spec.Hooks
	//nolint:staticcheck // Prestart is deprecated in the spec, still what older clients write.
	if len(h.Prestart) == 0 && len(h.CreateRuntime) == 0 {
		return nil, nil
	}
	ownNetns := false
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			if ns.Path != "" {
				return nil, nil
			}
			ownNetns = true
		}
	}
	if !ownNetns {
		log.Info("network hooks in the spec of a container on the host's network: not run (no network namespace of its own to give them)")
		return nil, nil
	}
	initial, err := policyFromAnnotations(spec.Annotations)
	if err != nil {
		return nil, err
	}
	return &HookNetwork{ID: id, Bundle: bundle, Spec: spec, Initial: initial, Log: log}, nil
}

// Attach implements sandbox.Network.
func (n *HookNetwork) Attach(ctx context.Context) (sandbox.NetworkAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.holder != nil {
		return sandbox.NetworkAttachment{}, fmt.Errorf("hook network of %s already attached: %w", n.ID, errdefs.ErrAlreadyExists)
	}
	if len(n.Spec.Hooks.CreateContainer) > 0 || len(n.Spec.Hooks.StartContainer) > 0 {
		n.Log.Warn("createContainer and startContainer hooks are not run: they run in the container's namespaces, which are in the VM")
	}
	holder, err := newNSHolder()
	if err != nil {
		return sandbox.NetworkAttachment{}, fmt.Errorf("network namespace for the hooks of %s: %w", n.ID, err)
	}
	//nolint:staticcheck // Prestart: see HooksFromSpec.
	hooks := append(append([]specs.Hook{}, n.Spec.Hooks.Prestart...), n.Spec.Hooks.CreateRuntime...)
	if err := n.runHooks(ctx, "prestart/createRuntime", hooks, specs.StateCreating, holder.tid); err != nil {
		n.undo(holder)
		return sandbox.NetworkAttachment{}, err
	}
	net := &Network{NetNS: holder.path, HostNetNS: n.HostNetNS, Initial: n.Initial, Log: n.Log.WithField("netns", holder.path)}
	att, err := net.Attach(ctx)
	if err != nil {
		n.undo(holder)
		return sandbox.NetworkAttachment{}, fmt.Errorf("the network the hooks of %s made: %w", n.ID, err)
	}
	n.holder, n.net = holder, net
	return att, nil
}

// undo runs the poststop hooks and ends the namespace after a failed
// Attach (the hooks may have done part of their work: CNI DEL cleans it).
func (n *HookNetwork) undo(holder *nsHolder) {
	if err := n.runHooks(context.Background(), "poststop", n.Spec.Hooks.Poststop, specs.StateStopped, holder.tid); err != nil {
		n.Log.WithError(err).Warn("poststop hooks after a failed network setup")
	}
	holder.close()
}

// Detach implements sandbox.Network. Ordering: the redirects go first,
// then the poststop hooks run while the namespace still exists (CNI DEL
// needs it), then the namespace ends.
func (n *HookNetwork) Detach(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.holder == nil {
		return nil
	}
	holder, net := n.holder, n.net
	n.holder, n.net = nil, nil
	err := net.Detach(ctx)
	// The poststop hooks have their own timeouts, not what is left of the
	// teardown's bound on the redirects (CNI DEL may take longer).
	if herr := n.runHooks(context.WithoutCancel(ctx), "poststop", n.Spec.Hooks.Poststop, specs.StateStopped, holder.tid); herr != nil {
		err = errors.Join(err, herr)
	}
	holder.close()
	return err
}

// SetEgressPolicy implements sandbox.EgressNetwork.
func (n *HookNetwork) SetEgressPolicy(ctx context.Context, p egress.Policy) error {
	net, err := n.attachedNet()
	if err != nil {
		return err
	}
	return net.SetEgressPolicy(ctx, p)
}

// EgressStatus implements sandbox.EgressNetwork.
func (n *HookNetwork) EgressStatus(ctx context.Context) (egress.Status, error) {
	net, err := n.attachedNet()
	if err != nil {
		return egress.Status{}, err
	}
	return net.EgressStatus(ctx)
}

func (n *HookNetwork) attachedNet() (*Network, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.net == nil {
		return nil, fmt.Errorf("the hook network of %s is not attached: %w", n.ID, errdefs.ErrFailedPrecondition)
	}
	return n.net, nil
}

// defaultHookTimeout bounds a hook without a timeout of its own.
const defaultHookTimeout = 2 * time.Minute

// runHooks runs hooks in order with the OCI state on stdin; the first
// failure stops them.
func (n *HookNetwork) runHooks(ctx context.Context, kind string, hooks []specs.Hook, status specs.ContainerState, pid int) error {
	if len(hooks) == 0 {
		return nil
	}
	state, err := json.Marshal(specs.State{Version: n.Spec.Version, ID: n.ID, Status: status, Pid: pid, Bundle: n.Bundle, Annotations: n.Spec.Annotations})
	if err != nil {
		return err
	}
	for i, h := range hooks {
		if err := runHook(ctx, h, state); err != nil {
			return fmt.Errorf("%s hook %d (%s) of %s: %w", kind, i, h.Path, n.ID, err)
		}
		n.Log.WithFields(logrus.Fields{"hook": h.Path, "kind": kind, "pid": pid}).Info("OCI hook ran on the host")
	}
	return nil
}

// runHook runs one hook as runc does: its path, args (args[0] is argv[0])
// and env only, the state on stdin.
func runHook(ctx context.Context, h specs.Hook, state []byte) error {
	timeout := defaultHookTimeout
	if h.Timeout != nil {
		if *h.Timeout <= 0 {
			return fmt.Errorf("timeout %d: must be positive: %w", *h.Timeout, errdefs.ErrInvalidArgument)
		}
		timeout = time.Duration(*h.Timeout) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Path)
	if len(h.Args) > 0 {
		cmd.Args = h.Args
	}
	cmd.Env = h.Env
	cmd.Stdin = bytes.NewReader(state)
	var out boundedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("not done within %v: %w: %s", timeout, context.DeadlineExceeded, out.String())
		}
		return fmt.Errorf("%w: %s", err, out.String())
	}
	return nil
}

// boundedBuffer keeps the first 4 KiB written to it (a hook's output, for errors).
type boundedBuffer struct{ b bytes.Buffer }

func (w *boundedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (w *boundedBuffer) String() string { return w.b.String() }

// nsHolder is a locked OS thread in a network namespace it unshared; the
// namespace lives as long as the thread (close ends it).
type nsHolder struct {
	tid  int
	path string
	done chan struct{}
}

func newNSHolder() (*nsHolder, error) {
	h := &nsHolder{done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and the
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare a network namespace: %w", err)
			return
		}
		h.tid = unix.Gettid()
		h.path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), h.tid)
		errc <- nil
		<-h.done
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return h, nil
}

func (h *nsHolder) close() { close(h.done) }
