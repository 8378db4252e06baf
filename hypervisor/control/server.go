package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
)

// Snapshotter is a Target that can snapshot and roll back.
type Snapshotter interface {
	Snapshot(dir string, incremental bool) (*SnapshotResult, error)
	Rollback(dir string) (*RollbackResult, error)
}

// DiskSetter is a Target whose drives can be re-pointed at other backing
// files (serial names the drive; path is absolute).
type DiskSetter interface {
	SetDisk(serial, path string, readOnly bool) (*DiskSetResult, error)
}

// Restorer is a Target that can restore a snapshot (a standby VMM).
type Restorer interface {
	Restore(dir string, paused bool) (*RestoreResult, error)
}

// Target is what the socket controls.
type Target interface {
	Pause() error
	Resume() error
	Stop()
	InfoJSON() (json.RawMessage, error)
}

// maxLine bounds a request line; anything longer is refused.
const maxLine = 4096

// Server serves a Target on a Unix socket.
type Server struct {
	ln     net.Listener
	path   string
	target Target
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen creates the socket at path (replacing a stale one) and serves it.
//
// Ordering: the socket is bound and listening under a temporary name first and only then renamed to path,
// so a client that waits for path to exist (the shim does) never connects between bind and listen, when
// it would be refused.
func Listen(path string, t Target) (*Server, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	tmp := path + ".new"
	os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // it is unlinked under its final name by Close
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s := &Server{ln: ln, path: path, target: t, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, maxLine)
	enc := json.NewEncoder(c)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			enc.Encode(Response{Error: fmt.Sprintf("request longer than %d bytes", maxLine)})
			return
		}
		if err != nil {
			return
		}
		resp, after := s.handle(line)
		err = enc.Encode(resp)
		if after != nil {
			// Ordering: only now that the reply is written: a stop ends the
			// VMM, whose Close drops this connection, and a reply still to
			// be written then is lost (the client saw EOF).
			go after()
		}
		if err != nil {
			return
		}
	}
}

// SetTarget replaces what the socket controls (a standby VMM's target by the
// restored VM's); requests after it go to t.
func (s *Server) SetTarget(t Target) {
	s.mu.Lock()
	s.target = t
	s.mu.Unlock()
}

// handle answers one request; after, if not nil, is to run once the
// answer is written.
func (s *Server) handle(line []byte) (resp Response, after func()) {
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return Response{Error: fmt.Sprintf("bad request: %v", err)}, nil
	}
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	resp, after, err := dispatch(target, req)
	if err != nil {
		return Response{Error: err.Error()}, nil
	}
	resp.OK = true
	return resp, after
}

// dispatch runs req on t. Ordering: the op must be known before its paths
// are checked (an unknown op is refused as such), and the paths are checked
// before any op runs.
func dispatch(t Target, req Request) (resp Response, after func(), err error) {
	if !knownOps[req.Op] {
		return resp, nil, fmt.Errorf("unknown op %q", req.Op)
	}
	if err := req.checkPaths(); err != nil {
		return resp, nil, err
	}
	switch req.Op {
	case OpPause:
		err = t.Pause()
	case OpResume:
		err = t.Resume()
	case OpStop:
		// Answer before the VM is torn down: Stop waits for the vCPUs.
		after = t.Stop
	case OpInfo:
		resp.Info, err = t.InfoJSON()
	case OpSnapshot, OpRollback:
		resp.Result, err = snapshotOp(t, req)
	case OpRestore:
		resp.Result, err = restoreOp(t, req)
	case OpDiskSet:
		resp.Result, err = diskSetOp(t, req)
	}
	return resp, after, err
}

func snapshotOp(t Target, req Request) (json.RawMessage, error) {
	sn, ok := t.(Snapshotter)
	switch {
	case !ok:
		return nil, fmt.Errorf("%s: not supported by this VMM", req.Op)
	case req.Dir == "":
		return nil, fmt.Errorf("%s: no dir given", req.Op)
	case req.Op == OpSnapshot:
		return encode(sn.Snapshot(req.Dir, req.Incremental))
	default:
		return encode(sn.Rollback(req.Dir))
	}
}

func restoreOp(t Target, req Request) (json.RawMessage, error) {
	rs, ok := t.(Restorer)
	switch {
	case !ok:
		return nil, errors.New("restore: this VMM already runs a VM (only a standby cube-vmm restores)")
	case req.Dir == "":
		return nil, errors.New("restore: no dir given")
	default:
		return encode(rs.Restore(req.Dir, req.Paused))
	}
}

func diskSetOp(t Target, req Request) (json.RawMessage, error) {
	ds, ok := t.(DiskSetter)
	switch {
	case !ok:
		return nil, errors.New("disk-set: not supported by this VMM")
	case req.Serial == "":
		return nil, errors.New("disk-set: no serial given")
	case req.Path == "":
		return nil, errors.New("disk-set: no path given")
	default:
		return encode(ds.SetDisk(req.Serial, req.Path, req.ReadOnly))
	}
}

// encode is an op's result as the reply carries it (none for a nil one).
func encode[T any](v *T, err error) (json.RawMessage, error) {
	if err != nil || v == nil {
		return nil, err
	}
	return json.Marshal(v)
}

// Close stops accepting, drops connections and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	os.Remove(s.path)
	s.wg.Wait()
	return err
}
