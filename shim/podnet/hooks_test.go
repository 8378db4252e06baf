package podnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hookScript is a network hook as nerdctl's or a CNI wrapper would be: it
// reads the OCI state from stdin, and on "create" makes, in the namespace
// of the state's pid, eth0 (10.99.0.5/24) whose peer peer0 goes to the
// "host" namespace (the thread PEER); on "stop" it records whether the
// namespace still exists. Each call is logged with its status and pid.
const hookScript = `#!/bin/sh
state=$(cat)
pid=$(echo "$state" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
status=$(echo "$state" | sed -n 's/.*"status":"\([a-z]*\)".*/\1/p')
echo "$1 $status $pid" >> LOG
case "$1" in
create)
	nsenter --net=/proc/$pid/ns/net ip link add name eth0 type veth peer name peer0 netns PEER &&
	nsenter --net=/proc/$pid/ns/net ip addr add 10.99.0.5/24 dev eth0 &&
	nsenter --net=/proc/$pid/ns/net ip link set eth0 up &&
	nsenter --net=/proc/PEER/ns/net ip link set peer0 up ;;
stop)
	test -e /proc/$pid/ns/net && echo "stop netns-alive" >> LOG ;;
fail)
	echo "no IP addresses available" >&2; exit 3 ;;
esac
`

func hookSpec(script string, create ...string) *specs.Spec {
	hook := func(arg string) specs.Hook { return specs.Hook{Path: script, Args: []string{script, arg}} }
	h := &specs.Hooks{Poststop: []specs.Hook{hook("stop")}}
	for _, c := range create {
		h.CreateRuntime = append(h.CreateRuntime, hook(c))
	}
	return &specs.Spec{Version: specs.Version, Hooks: h, Annotations: map[string]string{"nerdctl/name": "web"},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}}}}
}

func TestHooksFromSpec(t *testing.T) {
	log := logrus.NewEntry(logrus.New())
	if n, err := HooksFromSpec("c1", "/b", hookSpec("/h", "create"), log); err != nil || n == nil || n.ID != "c1" || n.Bundle != "/b" {
		t.Errorf("hooks + own netns: %+v %v", n, err)
	}
	noHooks := hookSpec("/h")
	noHooks.Hooks.Poststop = nil
	joined := hookSpec("/h", "create")
	joined.Linux.Namespaces[1].Path = "/var/run/netns/x"
	hostNet := hookSpec("/h", "create")
	hostNet.Linux.Namespaces = hostNet.Linux.Namespaces[:1]
	for name, s := range map[string]*specs.Spec{"no hooks": noHooks, "netns path": joined, "host network": hostNet, "no linux": {Hooks: &specs.Hooks{}}} {
		if n, err := HooksFromSpec("c1", "/b", s, log); n != nil || err != nil {
			t.Errorf("%s: %+v %v, want no hook network", name, n, err)
		}
	}
	bad := hookSpec("/h", "create")
	bad.Annotations[AnnotationDenyOut] = "nope"
	if _, err := HooksFromSpec("c1", "/b", bad, log); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad policy annotation: %v", err)
	}
}

// TestHookNetwork: Attach runs the createRuntime hook with the state of a
// namespace the shim holds (status creating, its pid's /proc/<pid>/ns/net
// the namespace), then connects what the hook made to the tap; Detach
// runs the poststop hook while the namespace exists and then ends it. A
// failing hook fails Attach naming it, after the poststop hooks ran.
func TestHookNetwork(t *testing.T) {
	peer := newNSThread(t)
	// peer.path is /proc/<pid>/task/<tid>/ns/net: ip's "netns <pid>" takes the tid.
	peerTid := filepath.Base(filepath.Dir(filepath.Dir(peer.path)))
	dir := t.TempDir()
	logFile := filepath.Join(dir, "hook.log")
	script := filepath.Join(dir, "hook.sh")
	os.WriteFile(script, []byte(strings.NewReplacer("LOG", logFile, "PEER", peerTid).Replace(hookScript)), 0o755)
	hookLog := func() string { b, _ := os.ReadFile(logFile); return string(b) }
	var peerIdx int
	log := logrus.NewEntry(logrus.New())

	n, err := HooksFromSpec("c1", dir, hookSpec(script, "create"), log)
	if err != nil {
		t.Fatal(err)
	}
	n.HostNetNS = peer.path
	att, err := n.Attach(context.Background())
	if err != nil {
		t.Fatalf("Attach: %v (hook log %q)", err, hookLog())
	}
	tap := att.NICs[0].Tap
	defer tap.Close()
	g := att.Guest.Interfaces[0]
	if g.Name != "eth0" || len(g.Addresses) != 1 || g.Addresses[0] != "10.99.0.5/24" {
		t.Errorf("guest interface %+v, want the hook's eth0", g)
	}
	var pid int
	if _, err := fmt.Sscanf(hookLog(), "create creating %d", &pid); err != nil || pid == 0 {
		t.Fatalf("hook log %q: want the createRuntime hook called with status creating and a pid", hookLog())
	}
	// The state's pid names the namespace the hook configured, which the tap is in.
	if fi1, e1 := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid)); e1 != nil {
		t.Errorf("the state's pid %d: %v", pid, e1)
	} else if fi2, e2 := os.Stat(n.net.NetNS); e2 != nil || !os.SameFile(fi1, fi2) {
		t.Errorf("the state's pid's namespace is not the attached one (%v)", e2)
	}
	// The VM's frames reach the host end the hook made, and the egress policy applies there.
	peer.do(t, func() error {
		_, idx, err := linkIndex("peer0")
		peerIdx = idx
		return err
	})
	if st, err := n.EgressStatus(context.Background()); err != nil || st.Device != "peer0" {
		t.Errorf("egress status %+v %v, want device peer0", st, err)
	}
	var got []byte
	peer.do(t, func() error {
		s, err := rawSocket(peerIdx)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		if _, err := tap.Write(append(make([]byte, 10), testFrame("ff:ff:ff:ff:ff:ff", "vm→hooknet")...)); err != nil {
			return err
		}
		got, err = recvUntil(s, "vm→hooknet")
		return err
	})
	if !bytes.Contains(got, []byte("vm→hooknet")) {
		t.Error("a frame written to the tap did not reach the hook's host end")
	}

	if err := n.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l := hookLog(); !strings.Contains(l, fmt.Sprintf("stop stopped %d\nstop netns-alive", pid)) {
		t.Errorf("hook log %q: want the poststop hook called (status stopped, same pid) while the namespace existed", l)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the namespace's thread %d still exists after Detach", pid)
		}
	}
	if err := n.Detach(context.Background()); err != nil {
		t.Errorf("second Detach: %v", err)
	}

	// A failing hook: Attach fails naming it, poststop ran.
	os.Remove(logFile)
	n, _ = HooksFromSpec("c2", dir, hookSpec(script, "fail"), log)
	n.HostNetNS = peer.path
	if _, err := n.Attach(context.Background()); err == nil || !strings.Contains(err.Error(), "createRuntime hook 0 ("+script+")") ||
		!strings.Contains(err.Error(), "no IP addresses available") {
		t.Errorf("failing hook: %v, want it named with its output", err)
	}
	if l := hookLog(); !strings.Contains(l, "stop stopped") {
		t.Errorf("hook log %q: want poststop after the failed setup", l)
	}
}

func linkIndex(name string) (string, int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return "", 0, err
	}
	return l.Attrs().Name, l.Attrs().Index, nil
}
