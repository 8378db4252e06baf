// Package podnet connects a sandbox VM to a CRI pod's network: containerd's
// CRI creates the pod's network namespace and runs CNI in it before the
// sandbox (pause) container's task is created; CNI leaves an interface in
// it (a veth, eth0) with the pod's addresses and routes. podnet, inside that
// namespace:
//
//   - makes a tap (TUNSETIFF on /dev/net/tun opened there, so the tap lives
//     there; not persistent: it lives as long as an fd to it, i.e. the VMM's),
//     which cube-vmm inherits by fd (-net fd=N) — the VMM knows nothing of
//     namespaces or CNI;
//   - joins the tap and the CNI interface with tc, Kata's "tcfilter" model:
//     an ingress qdisc on each and a u32 match-all filter whose mirred action
//     redirects every frame to the other's egress. CNI's view is unchanged:
//     the veth keeps its MAC, addresses and routes (CNI DEL and CHECK find
//     what ADD made), the namespace's own stack just never sees a frame;
//   - reads the interface's MAC, MTU, addresses and routes, which the guest's
//     NIC takes over: the same MAC (the peer — a bridge, a router — has learnt
//     it, and frames redirected to the guest still carry it as destination;
//     with another MAC the guest's stack would drop them as PACKET_OTHERHOST),
//     the same addresses and routes.
//
// DNS comes from the resolv.conf CRI writes for the pod and bind-mounts into
// the sandbox container's spec (for VM runtimes: "Add resolv.conf for
// katacontainers to setup the DNS of pod VM properly").
package podnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netns"

	"github.com/cube-runtime/cube/shim/egress"
	"github.com/cube-runtime/cube/shim/sandbox"
)

// TapName is the tap podnet makes in the pod's network namespace (one per
// namespace: each pod has its own).
const TapName = "cube-tap0"

// CRI's annotations: only a CRI sandbox container's network namespace is
// taken over (see FromSpec).
const (
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
	containerTypeSandbox    = "sandbox"
)

// Network is the sandbox.Network of one pod's CNI network namespace.
type Network struct {
	// NetNS is the namespace's path (/var/run/netns/cni-…).
	NetNS string
	// DNS for the guest's resolv.conf (nil: none found).
	DNS *sandbox.DNSConfig
	// HostNetNS is the path of the namespace the pod's veth peer is in,
	// where egress policies are enforced (egress.go); "" is the shim's own
	// (the host's: where CNI's bridge plugin puts it). Tests set it.
	HostNetNS string
	// Initial is the egress policy the spec's annotations set (nil: none);
	// Attach applies it before the VMM starts.
	Initial *egress.Policy
	Log     *logrus.Entry

	mu       sync.Mutex
	attached *attachment // what Detach removes
}

var _ sandbox.Network = (*Network)(nil)
var _ sandbox.NICCounter = (*Network)(nil)

// NICCount implements sandbox.NICCounter: Attach gives the VM one NIC (the
// tap redirected to and from the CNI interface), so the sandbox is restored
// from the automatic template with one NIC.
func (n *Network) NICCount() int { return 1 }

// attachment is what Attach made in the namespace.
type attachment struct {
	cniIndex int    // the CNI interface (ingress qdisc + filter to the tap)
	cniName  string // for logs
	tapIndex int
	qdiscs   []int // interfaces redirect gave an ingress qdisc
	// hostEnd is the host's end of the pod's link (the CNI veth's peer),
	// "" when there is none; egress its policy filter, once one was set.
	hostEnd    string
	hostEndErr error // why the host end could not be looked up
	egress     *egress.Filter
}

// FromSpec returns the network of a CRI sandbox container's spec, or nil
// (no error) when the VM gets none: no network namespace path (a
// host-network pod, a plain `ctr run`), or a container that is not a CRI
// pod's sandbox container — a namespace named by hand (`ctr run --with-ns
// network:…`) may be another workload's, and redirecting its interface's
// traffic into a VM would take it away from it.
func FromSpec(spec *specs.Spec, log *logrus.Entry) (*Network, error) {
	if spec == nil || spec.Linux == nil {
		return nil, nil
	}
	path := ""
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			path = ns.Path
		}
	}
	if path == "" {
		return nil, nil
	}
	if spec.Annotations[containerTypeAnnotation] != containerTypeSandbox {
		log.WithField("netns", path).Info("network namespace path of a non-CRI-sandbox container: the VM gets no NIC (pod networking is for CRI pods)")
		return nil, nil
	}
	dns, err := dnsFromSpec(spec)
	if err != nil {
		return nil, err
	}
	initial, err := policyFromAnnotations(spec.Annotations)
	if err != nil {
		return nil, err
	}
	return &Network{NetNS: path, DNS: dns, Initial: initial, Log: log.WithField("netns", path)}, nil
}

// inNetns runs f on a locked OS thread inside the network namespace at
// path. If the thread cannot return to the original namespace it is not
// unlocked, so the Go runtime ends it rather than reuse it.
func inNetns(path string, f func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pod network namespace %s: %w: %w", path, err, errdefs.ErrNotFound)
		}
		return fmt.Errorf("open pod network namespace %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("current network namespace: %w", err)
			return // the thread stays locked: it ends with the goroutine
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter pod network namespace %s: %w", path, err)
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		ferr := f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Attach implements sandbox.Network: in the pod's namespace, find the CNI
// interface, make the tap and the redirects, and describe the interface for
// the guest. On failure nothing it made stays.
func (n *Network) Attach(ctx context.Context) (sandbox.NetworkAttachment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.attached != nil {
		return sandbox.NetworkAttachment{}, fmt.Errorf("pod network %s already attached: %w", n.NetNS, errdefs.ErrAlreadyExists)
	}
	var res sandbox.NetworkAttachment
	peerIndex := 0
	err := inNetns(n.NetNS, func() error {
		cni, err := findCNILink()
		if err != nil {
			return err
		}
		guest, err := describe(cni)
		if err != nil {
			return err
		}
		tap, tapLink, err := makeTap(TapName, cni.Attrs().MTU)
		if err != nil {
			return err
		}
		a := &attachment{cniIndex: cni.Attrs().Index, cniName: cni.Attrs().Name, tapIndex: tapLink.Attrs().Index}
		if cni.Type() == "veth" {
			peerIndex = cni.Attrs().ParentIndex
		}
		if err := redirect(a); err != nil {
			unredirect(a)
			tap.Close() // the tap is not persistent: it goes with its last fd
			return err
		}
		n.attached = a
		res.NICs = []sandbox.NIC{{Tap: tap, MAC: guest.MAC}}
		res.Guest = sandbox.NetworkConfig{Interfaces: []sandbox.NetInterface{guest}, DNS: n.DNS}
		return nil
	})
	if err != nil {
		return sandbox.NetworkAttachment{}, fmt.Errorf("connect the VM to the pod network in %s: %w", n.NetNS, err)
	}
	// In the shim's namespace, not the pod's: the veth's peer.
	if n.attached.hostEnd, err = n.findHostEnd(peerIndex, n.attached.cniIndex); err != nil {
		n.attached.hostEndErr = err
		n.Log.WithError(err).Warn("the host's end of the pod's link not found: egress policies cannot be set")
	}
	n.logHostEnd(n.attached)
	// Ordering: the annotations' policy holds before the VMM starts (Attach
	// returns to it), so the VM's first frame meets it.
	if err := n.applyInitialPolicy(); err != nil {
		a := n.attached
		n.attached = nil
		closeTap(res)
		if uerr := inNetns(n.NetNS, func() error { unredirect(a); return deleteTap(a.tapIndex) }); uerr != nil {
			n.Log.WithError(uerr).Warn("undo the pod network attach")
		}
		return sandbox.NetworkAttachment{}, fmt.Errorf("egress policy of pod network %s from the annotations: %w", n.NetNS, err)
	}
	g := res.Guest.Interfaces[0]
	n.Log.WithFields(logrus.Fields{"interface": g.Name, "mac": g.MAC, "mtu": g.MTU, "addresses": fmt.Sprint(g.Addresses),
		"routes": len(g.Routes), "tap": TapName}).Info("pod network attached: tap redirected to and from the CNI interface")
	return res, nil
}

// Detach implements sandbox.Network: remove the redirects (and the tap, if
// something still holds it). A namespace or interface already gone (CRI
// tears the network down and removes the namespace) is not an error.
func (n *Network) Detach(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	a := n.attached
	if a == nil {
		return nil
	}
	n.attached = nil
	// Ordering: the rules on the host's end go first: they are the host's,
	// and outlive the pod's namespace otherwise.
	n.removeEgress(a)
	err := inNetns(n.NetNS, func() error {
		unredirect(a)
		return deleteTap(a.tapIndex)
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove the VM's tap and redirects in %s: %w", n.NetNS, err)
	}
	n.Log.WithField("interface", a.cniName).Info("pod network detached")
	return nil
}

// closeTap closes the tap fds of an attachment Attach will not return.
func closeTap(res sandbox.NetworkAttachment) {
	for _, nic := range res.NICs {
		if nic.Tap != nil {
			nic.Tap.Close()
		}
	}
}

// macString formats a MAC as cube-vmm and the agent take it.
func macString(m net.HardwareAddr) string { return m.String() }
