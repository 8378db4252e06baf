package egress

import (
	"errors"
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// ChainName is the one chain of a filter's table.
const ChainName = "egress"

// Filter enforces a sandbox's policy on one host interface: the ingress of
// Device is what the sandbox sends. Safe for concurrent use.
type Filter struct {
	// Device is the host interface the sandbox's frames arrive on.
	Device string
	// Table names the netdev table (one per sandbox link: TableName).
	Table string
	// NetNS, when set, is the path of the network namespace Device is in
	// (tests); "" is the caller's.
	NetNS string
	Log   *logrus.Entry

	mu      sync.Mutex
	policy  *Policy // nil: never set (open)
	applied bool    // the table exists
}

// TableName is the table of the filter on host interface dev.
func TableName(dev string) string { return "cube-egress-" + dev }

// Status is a filter's policy and its rules' counters.
type Status struct {
	Policy   Policy
	Device   string
	Counters []Counter
}

// conn returns an nftables connection in f's namespace and what closes it.
func (f *Filter) conn() (*nftables.Conn, func(), error) {
	var opts []nftables.ConnOption
	done := func() {}
	if f.NetNS != "" {
		fd, err := unix.Open(f.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("open network namespace %s: %w", f.NetNS, err)
		}
		done = func() { unix.Close(fd) }
		opts = append(opts, nftables.WithNetNSFd(fd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	return c, done, nil
}

func (f *Filter) objects() (*nftables.Table, *nftables.Chain) {
	t := &nftables.Table{Name: f.Table, Family: nftables.TableFamilyNetdev}
	policy := nftables.ChainPolicyAccept
	c := &nftables.Chain{Name: ChainName, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookIngress,
		Priority: nftables.ChainPriorityFilter, Device: f.Device, Policy: &policy}
	return t, c
}

// Set makes p the policy: the chain's rules replaced in one transaction
// (an open policy removes the table).
func (f *Filter) Set(p Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Device == "" || f.Table == "" {
		return fmt.Errorf("egress filter without a device or table: %w", errdefs.ErrInvalidArgument)
	}
	if p.IsOpen() {
		if err := f.removeLocked(); err != nil {
			return err
		}
		f.policy = &p
		return nil
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	t, ch := f.objects()
	// Ordering: table, then its base chain on the device, then the chain
	// emptied, then the new rules: one batch, applied by the kernel as one
	// transaction or not at all.
	c.AddTable(t)
	c.AddChain(ch)
	c.FlushChain(ch)
	for _, r := range Rules(t, ch, p) {
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("nftables table %s on %s: %w (is the sandbox's host interface gone?): %w", f.Table, f.Device, err, errdefs.ErrNotFound)
		}
		return fmt.Errorf("nftables table %s on %s: %w", f.Table, f.Device, err)
	}
	f.applied = true
	f.policy = &p
	if f.Log != nil {
		f.Log.WithFields(logrus.Fields{"device": f.Device, "table": f.Table, "policy": p.String()}).Info("egress policy set")
	}
	return nil
}

// Status returns the policy and the counters of its rules.
func (f *Filter) Status() (Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Status{Policy: Open(), Device: f.Device}
	if f.policy != nil {
		st.Policy = *f.policy
	}
	if !f.applied {
		return st, nil
	}
	c, done, err := f.conn()
	if err != nil {
		return st, err
	}
	defer done()
	t, ch := f.objects()
	rs, err := c.GetRules(t, ch)
	if err != nil {
		return st, fmt.Errorf("read the rules of nftables table %s: %w", f.Table, err)
	}
	st.Counters = countersOf(rs)
	return st, nil
}

// Remove deletes the table (nothing if there is none). The policy stays
// what it was, so a later Set starts from it.
func (f *Filter) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removeLocked()
}

func (f *Filter) removeLocked() error {
	if !f.applied {
		return nil
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	t, _ := f.objects()
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete nftables table %s: %w", f.Table, err)
	}
	f.applied = false
	if f.Log != nil {
		f.Log.WithFields(logrus.Fields{"device": f.Device, "table": f.Table}).Info("egress rules removed")
	}
	return nil
}
