// Package control is the VMM's control socket: a Unix stream socket
// speaking newline-delimited JSON, one request and one response per line.
//
//	→ {"op":"pause"}            ← {"ok":true}
//	→ {"op":"info"}             ← {"ok":true,"info":{...}}
//	→ {"op":"bogus"}            ← {"ok":false,"error":"unknown op \"bogus\""}
//
//	→ {"op":"snapshot","dir":"/snaps/a"}  ← {"ok":true,"result":{...}}
//	→ {"op":"rollback","dir":"/snaps/a"}  ← {"ok":true,"result":{...}}
//	→ {"op":"disk-set","serial":"cube-slot-1","path":"/img/c2.img"}
//	                                      ← {"ok":true,"result":{"serial":…,"path":…,"sectors":N}}
//	→ {"op":"restore","dir":"/snaps/a"}   ← {"ok":true,"result":{...}}   (a standby VMM only)
//
// Ops: pause, resume, stop, info, snapshot/rollback when the target
// implements Snapshotter, and disk-set (re-point a drive at another
// backing file, a media change) when it implements DiskSetter, restore
// (once, into a standby VMM that has no VM yet) when it implements
// Restorer; the server's target may then change (SetTarget). The shim
// and the snapshot code drive a running cube-vmm through it.
package control

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// Request is one command.
type Request struct {
	Op          string `json:"op"`
	Dir         string `json:"dir,omitempty"`         // snapshot, rollback
	Incremental bool   `json:"incremental,omitempty"` // snapshot
	Serial      string `json:"serial,omitempty"`      // disk-set
	Path        string `json:"path,omitempty"`        // disk-set: absolute
	Paused      bool   `json:"paused,omitempty"`      // restore: vCPUs parked until resume
}

// Response answers one Request.
type Response struct {
	OK    bool            `json:"ok"`
	Error string          `json:"error,omitempty"`
	Info  json.RawMessage `json:"info,omitempty"`
	// Result is an op's outcome (snapshot and rollback figures).
	Result json.RawMessage `json:"result,omitempty"`
}

// Snapshotter is a Target that can snapshot and roll back.
type Snapshotter interface {
	Snapshot(dir string, incremental bool) (json.RawMessage, error)
	Rollback(dir string) (json.RawMessage, error)
}

// DiskSetter is a Target whose drives can be re-pointed at other backing
// files (serial names the drive; path is absolute).
type DiskSetter interface {
	SetDisk(serial, path string) (json.RawMessage, error)
}

// Restorer is a Target that can restore a snapshot (a standby VMM).
type Restorer interface {
	Restore(dir string, paused bool) (json.RawMessage, error)
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
	target Target
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen creates the socket at path (replacing a stale one) and serves it.
func Listen(path string, t Target) (*Server, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s := &Server{ln: ln, target: t, conns: map[net.Conn]struct{}{}}
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
			// Only now that the reply is written: a stop ends the VMM,
			// whose Close drops this connection, and a reply still to be
			// written then is lost (the client saw EOF).
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
	var err error
	switch req.Op {
	case "pause":
		err = target.Pause()
	case "resume":
		err = target.Resume()
	case "stop":
		// Answer before the VM is torn down: Stop waits for the vCPUs.
		after = target.Stop
	case "info":
		resp.Info, err = target.InfoJSON()
	case "restore":
		rs, ok := target.(Restorer)
		switch {
		case !ok:
			err = errors.New("restore: this VMM already runs a VM (only a standby cube-vmm restores)")
		case req.Dir == "":
			err = errors.New("restore: no dir given")
		case !filepath.IsAbs(req.Dir):
			err = fmt.Errorf("restore: dir %q is not absolute", req.Dir)
		default:
			resp.Result, err = rs.Restore(req.Dir, req.Paused)
		}
	case "snapshot", "rollback":
		sn, ok := target.(Snapshotter)
		switch {
		case !ok:
			err = fmt.Errorf("%s: not supported by this VMM", req.Op)
		case req.Dir == "":
			err = fmt.Errorf("%s: no dir given", req.Op)
		case req.Op == "snapshot":
			resp.Result, err = sn.Snapshot(req.Dir, req.Incremental)
		default:
			resp.Result, err = sn.Rollback(req.Dir)
		}
	case "disk-set":
		ds, ok := target.(DiskSetter)
		switch {
		case !ok:
			err = errors.New("disk-set: not supported by this VMM")
		case req.Serial == "":
			err = errors.New("disk-set: no serial given")
		case req.Path == "":
			err = errors.New("disk-set: no path given")
		case !filepath.IsAbs(req.Path):
			// Relative to what? The VMM's cwd is not the client's.
			err = fmt.Errorf("disk-set: path %q is not absolute", req.Path)
		default:
			resp.Result, err = ds.SetDisk(req.Serial, req.Path)
		}
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		resp.Error = err.Error()
		return resp, nil
	}
	resp.OK = true
	return resp, after
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
	s.wg.Wait()
	return err
}

// Client talks to a Server.
type Client struct {
	c   net.Conn
	r   *bufio.Reader
	enc *json.Encoder
	mu  sync.Mutex
}

// Dial connects to the control socket at path.
func Dial(path string) (*Client, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control: dial %s: %w", path, err)
	}
	return &Client{c: c, r: bufio.NewReader(c), enc: json.NewEncoder(c)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// Do sends op and returns the response; a refused op is an error.
func (c *Client) Do(op string) (Response, error) { return c.DoRequest(Request{Op: op}) }

// DoRequest sends req and returns the response; a refused op is an error.
func (c *Client) DoRequest(req Request) (Response, error) {
	op := req.Op
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.enc.Encode(req); err != nil {
		return Response{}, fmt.Errorf("control %s: %w", op, err)
	}
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return Response{}, fmt.Errorf("control %s: %w", op, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("control %s: bad response: %w", op, err)
	}
	if !resp.OK {
		return resp, fmt.Errorf("control %s: %s", op, resp.Error)
	}
	return resp, nil
}

// Pause, Resume and Stop are Do with that op.
func (c *Client) Pause() error  { _, err := c.Do("pause"); return err }
func (c *Client) Resume() error { _, err := c.Do("resume"); return err }
func (c *Client) Stop() error   { _, err := c.Do("stop"); return err }

// Info decodes the info op's payload into v.
func (c *Client) Info(v any) error {
	resp, err := c.Do("info")
	if err != nil {
		return err
	}
	return json.Unmarshal(resp.Info, v)
}

// Snapshot asks for a snapshot into dir and returns its figures.
func (c *Client) Snapshot(dir string, incremental bool) (json.RawMessage, error) {
	resp, err := c.DoRequest(Request{Op: "snapshot", Dir: dir, Incremental: incremental})
	return resp.Result, err
}

// SetDisk asks the VMM to re-point the drive with serial at the backing
// file path.
func (c *Client) SetDisk(serial, path string) (json.RawMessage, error) {
	resp, err := c.DoRequest(Request{Op: "disk-set", Serial: serial, Path: path})
	return resp.Result, err
}

// Rollback asks the VM to roll back in place to the snapshot in dir.
func (c *Client) Rollback(dir string) (json.RawMessage, error) {
	resp, err := c.DoRequest(Request{Op: "rollback", Dir: dir})
	return resp.Result, err
}

// Restore asks a standby VMM to restore the snapshot in dir (absolute) and run
// it (or keep its vCPUs parked with paused); the socket then controls that VM.
func (c *Client) Restore(dir string, paused bool) (json.RawMessage, error) {
	resp, err := c.DoRequest(Request{Op: "restore", Dir: dir, Paused: paused})
	return resp.Result, err
}
