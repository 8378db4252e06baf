package volume

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// A Syncer keeps guest copies of host trees (copied volumes) and files (the
// pod's /etc/hosts, resolv.conf, hostname) equal to the host's while the
// sandbox runs. It polls: every interval each item's fingerprint (lstat of
// every entry, no contents) is compared with the last one pushed; a change,
// or a Resync, reads the item and pushes it (SyncTree: the agent replays the
// kubelet's atomic swap; a file is rewritten in place, as a bind-mounted
// file must be). Polling catches every kind of change (inotify would miss
// ones below the top directory) and costs a few syscalls per entry per
// interval on trees of a few entries.

// Agent is the part of the guest agent a Syncer pushes through.
type Agent interface {
	SyncTree(ctx context.Context, dir string, t sandbox.Tree) (sandbox.TreeResult, error)
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
}

// MaxFile bounds a host file copied into the guest.
const MaxFile = 1 << 20

// DefaultInterval is how often a Syncer looks at the host.
const DefaultInterval = time.Second

// pushTimeout bounds one push to the agent.
const pushTimeout = 30 * time.Second

// SyncerOptions configure a Syncer.
type SyncerOptions struct {
	// Agent returns the sandbox's current agent client (a rollback replaces it).
	Agent    func() Agent
	Interval time.Duration // 0: DefaultInterval
	Limits   Limits        // zero: DefaultLimits
	Log      logrus.FieldLogger
}

// Syncer is safe for concurrent use.
type Syncer struct {
	o SyncerOptions

	mu      sync.Mutex
	items   map[string]*item // by guest path
	running bool
	stop    chan struct{}
	done    chan struct{}
}

type item struct {
	host, guest string
	tree        bool
	mode        uint32 // a file's
	refs        int
	fp          string
	dirty       bool
	lastErr     string
}

// NewSyncer returns a Syncer; its loop starts with the first item.
func NewSyncer(o SyncerOptions) *Syncer {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Limits == (Limits{}) {
		o.Limits = DefaultLimits
	}
	if o.Log == nil {
		o.Log = logrus.StandardLogger()
	}
	return &Syncer{o: o, items: map[string]*item{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// AddTree copies the host tree into the guest directory guest now and keeps
// it in sync until the last Release of guest. A second AddTree of the same
// guest directory (another container of the pod) only counts a reference.
func (s *Syncer) AddTree(ctx context.Context, host, guest string) error {
	return s.add(ctx, &item{host: host, guest: guest, tree: true})
}

// AddFile copies the host file (up to MaxFile bytes) to the guest path now,
// with the host file's permission bits, and keeps it in sync.
func (s *Syncer) AddFile(ctx context.Context, host, guest string) error {
	return s.add(ctx, &item{host: host, guest: guest})
}

func (s *Syncer) add(ctx context.Context, it *item) error {
	s.mu.Lock()
	if old := s.items[it.guest]; old != nil {
		old.refs++
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	if err := s.push(ctx, it); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.items[it.guest]; old != nil { // added meanwhile
		old.refs++
		return nil
	}
	it.refs = 1
	s.items[it.guest] = it
	if !s.running {
		s.running = true
		go s.loop()
	}
	return nil
}

// Release drops one reference to guest; the last one stops its syncing
// (the guest copy stays until the VM ends).
func (s *Syncer) Release(guest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if it := s.items[guest]; it != nil {
		if it.refs--; it.refs <= 0 {
			delete(s.items, guest)
		}
	}
}

// Resync pushes every item again at the next tick, changed or not: after a
// rollback the guest's copies are the snapshot's.
func (s *Syncer) Resync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.items {
		it.dirty = true
	}
}

// Close stops the loop (the VM is gone).
func (s *Syncer) Close() {
	s.mu.Lock()
	running := s.running
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.mu.Unlock()
	if running {
		<-s.done
	}
}

// Items lists the guest paths being synced.
func (s *Syncer) Items() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.items))
	for g := range s.items {
		out = append(out, g)
	}
	return out
}

func (s *Syncer) loop() {
	defer close(s.done)
	t := time.NewTicker(s.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.tick()
	}
}

// tick pushes what changed. Items are pushed one at a time, outside the lock.
func (s *Syncer) tick() {
	s.mu.Lock()
	items := make([]*item, 0, len(s.items))
	for _, it := range s.items {
		items = append(items, it)
	}
	s.mu.Unlock()
	for _, it := range items {
		select {
		case <-s.stop:
			return
		default:
		}
		s.check(it)
	}
}

func (s *Syncer) check(it *item) {
	fp, err := s.fingerprint(it)
	s.mu.Lock()
	changed := err == nil && (fp != it.fp || it.dirty)
	s.mu.Unlock()
	if err == nil && !changed {
		return
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
		err = s.push(ctx, it)
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.o.Log.WithFields(logrus.Fields{"host": it.host, "guest": it.guest})
	if err != nil {
		// Logged once per distinct error: a volume that stays broken does
		// not flood the log every interval. The guest keeps its last copy.
		if msg := err.Error(); msg != it.lastErr {
			it.lastErr = msg
			log.WithError(err).Warn("volume not synced into the VM; the guest keeps its last copy")
		}
		return
	}
	if it.lastErr != "" {
		log.Info("volume synced into the VM again")
	}
	it.lastErr = ""
}

func (s *Syncer) fingerprint(it *item) (string, error) {
	if it.tree {
		return Fingerprint(it.host, s.o.Limits)
	}
	fi, err := os.Stat(it.host)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%v %d %v %v", fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), fi.Sys()), nil
}

// push reads the item and writes it into the guest; on success it records
// the fingerprint taken before the read (a change during the read shows at
// the next tick).
func (s *Syncer) push(ctx context.Context, it *item) error {
	fp, err := s.fingerprint(it)
	if err != nil {
		return err
	}
	agent := s.o.Agent()
	if agent == nil {
		return fmt.Errorf("the sandbox's agent is not connected: %w", errdefs.ErrUnavailable)
	}
	if it.tree {
		t, err := ReadTree(it.host, s.o.Limits)
		if err != nil {
			return err
		}
		r, err := agent.SyncTree(ctx, it.guest, t)
		if err != nil {
			return fmt.Errorf("copy %s into the VM at %s: %w", it.host, it.guest, err)
		}
		if r.Written > 0 || r.Removed > 0 {
			s.o.Log.WithFields(logrus.Fields{"host": it.host, "guest": it.guest, "written": r.Written, "removed": r.Removed}).Debug("volume synced into the VM")
		}
	} else {
		data, mode, err := readFile(it.host)
		if err != nil {
			return err
		}
		if err := agent.WriteFile(ctx, it.guest, data, mode); err != nil {
			return fmt.Errorf("copy %s into the VM at %s: %w", it.host, it.guest, err)
		}
	}
	s.mu.Lock()
	it.fp, it.dirty = fp, false
	s.mu.Unlock()
	return nil
}

// readFile reads a host file bound into a container (its path, links
// followed, is what runc would bind), bounded by MaxFile.
func readFile(p string) ([]byte, uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, invalid("%s is not a regular file", p)
	}
	if fi.Size() > MaxFile {
		return nil, 0, invalid("host file %s: %d bytes, more than the %d copied into the VM", p, fi.Size(), MaxFile)
	}
	data := make([]byte, 0, fi.Size())
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		data = append(data, buf[:n]...)
		if len(data) > MaxFile {
			return nil, 0, invalid("host file %s: more than the %d bytes copied into the VM", p, MaxFile)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	return data, uint32(fi.Mode().Perm()), nil
}
