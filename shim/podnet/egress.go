package podnet

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/shim/egress"
)

// The pod's egress policy is enforced on the host's end of the pod's link
// (shim/egress): every frame the VM sends goes tap → (mirred) → the CNI
// veth → its peer in the host's namespace (the bridge's port, for the
// bridge plugin). The guest reaches neither namespace, and the pod's
// namespace cannot filter it (redirected frames skip its IP stack and its
// netfilter hooks).

// findHostEnd returns the name of the host's end of the pod's veth: the
// link peerIndex in the host's namespace, if it is a veth whose own peer is
// cniIndex (an index alone could name an unrelated interface). "" with no
// error: the pod's interface is no veth, or its peer is elsewhere.
func (n *Network) findHostEnd(peerIndex, cniIndex int) (string, error) {
	if peerIndex == 0 {
		return "", nil
	}
	var h *netlink.Handle
	var err error
	if n.HostNetNS == "" {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE) // route only: a host without xfrm refuses the rest
	} else {
		var ns netns.NsHandle
		if ns, err = netns.GetFromPath(n.HostNetNS); err != nil {
			return "", fmt.Errorf("open the host network namespace %s: %w", n.HostNetNS, err)
		}
		defer ns.Close()
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	}
	if err != nil {
		return "", fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(peerIndex)
	if err != nil {
		return "", nil
	}
	if l.Type() != "veth" || l.Attrs().ParentIndex != cniIndex {
		return "", nil
	}
	return l.Attrs().Name, nil
}

// filter returns the egress filter of the attached pod network.
func (n *Network) filter() (*egress.Filter, error) {
	a := n.attached
	switch {
	case a == nil:
		return nil, fmt.Errorf("pod network %s is not attached: %w", n.NetNS, errdefs.ErrFailedPrecondition)
	case a.hostEndErr != nil:
		return nil, fmt.Errorf("pod network %s: looking up the host's end of the pod's link failed (%v): no place on the host to enforce an egress policy: %w",
			n.NetNS, a.hostEndErr, errdefs.ErrFailedPrecondition)
	case a.hostEnd == "":
		return nil, fmt.Errorf("pod network %s: the pod's interface %s is not a veth whose peer is in the host's network namespace (the CNI plugin is not bridge or ptp?): no place on the host to enforce an egress policy: %w",
			n.NetNS, a.cniName, errdefs.ErrFailedPrecondition)
	}
	if a.egress == nil {
		a.egress = &egress.Filter{Device: a.hostEnd, Table: egress.TableName(a.hostEnd), NetNS: n.HostNetNS, Log: n.Log}
	}
	return a.egress, nil
}

// SetEgressPolicy implements sandbox.EgressNetwork.
func (n *Network) SetEgressPolicy(ctx context.Context, p egress.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.filter()
	if err != nil {
		return err
	}
	if err := f.Set(p); err != nil {
		return fmt.Errorf("egress policy of pod network %s: %w", n.NetNS, err)
	}
	return nil
}

// EgressStatus implements sandbox.EgressNetwork.
func (n *Network) EgressStatus(ctx context.Context) (egress.Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.filter()
	if err != nil {
		return egress.Status{}, err
	}
	return f.Status()
}

// removeEgress deletes a's egress rules (Detach).
func (n *Network) removeEgress(a *attachment) {
	if a.egress == nil {
		return
	}
	if err := a.egress.Remove(); err != nil {
		n.Log.WithError(err).WithField("device", a.hostEnd).Warn("egress rules not removed")
	}
}

// logHostEnd says where an egress policy would be enforced.
func (n *Network) logHostEnd(a *attachment) {
	if a.hostEnd == "" {
		n.Log.WithField("interface", a.cniName).Info("the pod's interface has no veth peer in the host's namespace: egress policies cannot be set")
		return
	}
	n.Log.WithFields(logrus.Fields{"interface": a.cniName, "host_end": a.hostEnd}).Debug("egress policies apply on the host's end of the pod's link")
}

// Annotations of the sandbox container's spec that set the egress policy
// at create, so that it holds from the VM's first frame (a CRI pod's
// annotations reach the sandbox spec when the runtime's pod_annotations
// lists them, e.g. "io.cube.network.*"). Lists are comma-separated.
const (
	AnnotationAllowInternet = "io.cube.network.allow-internet-access" // "true" or "false"
	AnnotationAllowOut      = "io.cube.network.allow-out"
	AnnotationDenyOut       = "io.cube.network.deny-out"
)

// policyFromAnnotations returns the policy the annotations set, or nil
// when none is there. A bad value is refused naming the annotation.
func policyFromAnnotations(a map[string]string) (*egress.Policy, error) {
	internet, hasInternet := a[AnnotationAllowInternet]
	allow, hasAllow := a[AnnotationAllowOut]
	deny, hasDeny := a[AnnotationDenyOut]
	if !hasInternet && !hasAllow && !hasDeny {
		return nil, nil
	}
	allowInternet := true
	switch strings.TrimSpace(internet) {
	case "", "true":
	case "false":
		allowInternet = false
	default:
		return nil, fmt.Errorf("annotation %s: %.32q is neither true nor false: %w", AnnotationAllowInternet, internet, errdefs.ErrInvalidArgument)
	}
	p, err := egress.Parse(allowInternet, splitList(allow), splitList(deny))
	if err != nil {
		return nil, fmt.Errorf("annotations %s / %s: %w", AnnotationAllowOut, AnnotationDenyOut, err)
	}
	return &p, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// applyInitialPolicy sets the policy from the annotations (Attach, before
// the VMM starts).
func (n *Network) applyInitialPolicy() error {
	if n.Initial == nil {
		return nil
	}
	f, err := n.filter()
	if err != nil {
		return err
	}
	return f.Set(*n.Initial)
}
