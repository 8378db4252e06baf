package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// CommandRequest is POST /sandboxes/{id}/commands's body.
type CommandRequest struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  string            `json:"cwd"`
	User string            `json:"user"`
	// Stdin keeps the process's stdin open for …/stdin; without it stdin is empty.
	Stdin bool `json:"stdin"`
}

// CommandInfo is a running command.
type CommandInfo struct {
	Pid       uint32    `json:"pid"`
	Cmd       string    `json:"cmd"`
	Args      []string  `json:"args"`
	Cwd       string    `json:"cwd,omitempty"`
	User      string    `json:"user,omitempty"`
	StartedAt time.Time `json:"startedAt"`
}

// Event is one line of a command's NDJSON output stream: "start" (pid),
// "stdout"/"stderr" (data, as it comes), then "exit" (exitCode) or "error".
type Event struct {
	Type     string `json:"type"`
	Pid      uint32 `json:"pid,omitempty"`
	Data     string `json:"data,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Error    string `json:"error,omitempty"`
}

// StdinRequest is …/stdin's body.
type StdinRequest struct {
	Data string `json:"data"`
	EOF  bool   `json:"eof"`
}

// KillRequest is …/kill's body (optional; SIGKILL by default).
type KillRequest struct {
	Signal string `json:"signal"`
}

// ExecIDPrefix begins the containerd exec id of every command cube-api
// starts: the guest's processes whose exec id has it are commands.
const ExecIDPrefix = "cmd-"

// command is a started process and who listens to its output.
type command struct {
	info   CommandInfo
	execID string
	proc   Process
	stdin  *io.PipeWriter // nil without stdin
	// adopted: cube-api did not start it in this run, or containerd forgot
	// it (a rollback brought it back): it is signalled through the shim and
	// dropped once the guest says it stopped (no output, no exit code).
	adopted bool
	// tag and envs: E2B's process tag and the envs it was started with (envd's List).
	tag  string
	envs map[string]string

	mu      sync.Mutex
	sub     chan Event    // nil once nobody listens
	subGone chan struct{} // closed when the listener leaves
}

// emit hands ev to the listener (dropped when nobody listens).
func (c *command) emit(ev Event) {
	c.mu.Lock()
	sub, gone := c.sub, c.subGone
	c.mu.Unlock()
	if sub == nil {
		return
	}
	select {
	case sub <- ev:
	case <-gone:
	}
}

// detach stops the listener's stream; the process runs on.
func (c *command) detach() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub != nil {
		close(c.subGone)
		c.sub = nil
	}
}

// streamWriter turns a process's output into events.
type streamWriter struct {
	c   *command
	typ string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.c.emit(Event{Type: w.typ, Data: string(p)})
	return len(p), nil
}

// commands are the running commands of every sandbox, by sandbox and pid,
// and the last ones that exited, by sandbox and exec id (a rollback may
// bring them back: their description is kept for the list).
type commands struct {
	mu   sync.Mutex
	m    map[string]map[uint32]*command
	past map[string]*pastCommands
}

// pastCommands are the descriptions of the commands of a sandbox that
// exited, the oldest first, at most maxPast.
type pastCommands struct {
	order []string
	info  map[string]CommandInfo
}

// maxPast bounds the exited commands remembered per sandbox.
const maxPast = 256

func newCommands() *commands {
	return &commands{m: map[string]map[uint32]*command{}, past: map[string]*pastCommands{}}
}

func (cs *commands) add(sandbox string, c *command) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m[sandbox] == nil {
		cs.m[sandbox] = map[uint32]*command{}
	}
	cs.m[sandbox][c.info.Pid] = c
}

func (cs *commands) remove(sandbox string, c *command) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m[sandbox][c.info.Pid] == c {
		delete(cs.m[sandbox], c.info.Pid)
	}
	if c.execID == "" {
		return
	}
	p := cs.past[sandbox]
	if p == nil {
		p = &pastCommands{info: map[string]CommandInfo{}}
		cs.past[sandbox] = p
	}
	if _, ok := p.info[c.execID]; !ok {
		p.order = append(p.order, c.execID)
	}
	p.info[c.execID] = c.info
	for len(p.order) > maxPast {
		delete(p.info, p.order[0])
		p.order = p.order[1:]
	}
}

func (cs *commands) forget(sandbox string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	delete(cs.m, sandbox)
	delete(cs.past, sandbox)
}

// reconcile makes the sandbox's list agree with the guest's processes:
// a command the guest runs that the list lacks (a rollback brought it
// back, or cube-api restarted) is adopted, with its description when it is
// remembered; an adopted one the guest no longer runs is dropped. The
// commands cube-api started and waits for leave when their wait ends.
func (cs *commands) reconcile(sandbox string, guest []GuestProcess, signal func(ctx context.Context, execID string, sig syscall.Signal) error, now time.Time) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	running := map[string]GuestProcess{}
	for _, g := range guest {
		if g.Running && strings.HasPrefix(g.ExecID, ExecIDPrefix) {
			running[g.ExecID] = g
		}
	}
	byExec := map[string]*command{}
	for pid, c := range cs.m[sandbox] {
		if _, ok := running[c.execID]; c.adopted && !ok {
			delete(cs.m[sandbox], pid)
			continue
		}
		byExec[c.execID] = c
	}
	for execID, g := range running {
		if byExec[execID] != nil {
			continue
		}
		info, ok := CommandInfo{}, false
		if p := cs.past[sandbox]; p != nil {
			info, ok = p.info[execID]
		}
		if !ok {
			info = CommandInfo{Args: []string{}, StartedAt: now}
		}
		info.Pid = g.Pid
		if cs.m[sandbox] == nil {
			cs.m[sandbox] = map[uint32]*command{}
		}
		cs.m[sandbox][g.Pid] = &command{info: info, execID: execID, adopted: true,
			proc: adoptedProcess{pid: g.Pid, execID: execID, signal: signal}}
	}
}

// adoptedProcess is a command cube-api does not wait for: signalled
// through the shim (which reaches also a process containerd forgot).
type adoptedProcess struct {
	pid    uint32
	execID string
	signal func(ctx context.Context, execID string, sig syscall.Signal) error
}

func (p adoptedProcess) Pid() uint32    { return p.pid }
func (p adoptedProcess) ExecID() string { return p.execID }

func (p adoptedProcess) Wait(ctx context.Context) (int, error) {
	return 0, fmt.Errorf("command %d came back with a rollback (or from before a restart of cube-api): its exit is not reported: %w", p.pid, errdefs.ErrNotImplemented)
}

func (p adoptedProcess) Kill(ctx context.Context, sig syscall.Signal) error {
	return p.signal(ctx, p.execID, sig)
}

func (p adoptedProcess) CloseStdin(ctx context.Context) error {
	return fmt.Errorf("command %d came back with a rollback (or from before a restart of cube-api): its stdin is not connected: %w", p.pid, errdefs.ErrFailedPrecondition)
}

// syncCommands reconciles sandbox id's commands with its guest's processes
// (a shim that cannot list them, or a sandbox that is not running, leaves
// the list as it is).
func (s *Server) syncCommands(ctx context.Context, id string) error {
	guest, err := s.be.GuestProcesses(ctx, id)
	if err != nil {
		return err
	}
	s.cmds.reconcile(id, guest, func(ctx context.Context, execID string, sig syscall.Signal) error {
		return s.be.SignalGuest(ctx, id, execID, sig)
	}, s.now().UTC())
	return nil
}

// command is sandbox's command pid. One cube-api did not start (it came
// with the sandbox's snapshot when the sandbox was created from one, or ran
// before a restart of cube-api) is adopted from the guest's processes first,
// as listCommands does: it is killable without a list before.
func (s *Server) command(ctx context.Context, sandbox, pid string) (*command, error) {
	c, err := s.cmds.get(sandbox, pid)
	if err == nil || !errdefs.IsNotFound(err) {
		return c, err
	}
	if ct, gerr := s.be.Get(ctx, sandbox); gerr != nil || stateOf(ct.Status) != "running" {
		return nil, err
	}
	if serr := s.syncCommands(ctx, sandbox); serr != nil {
		return nil, fmt.Errorf("%w (the guest's processes: %v)", err, serr)
	}
	return s.cmds.get(sandbox, pid)
}

func (cs *commands) get(sandbox, pid string) (*command, error) {
	n, err := strconv.ParseUint(pid, 10, 32)
	if err != nil {
		return nil, invalid("path parameter \"pid\": %q is not a process id", pid)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[sandbox][uint32(n)]
	if c == nil {
		return nil, fmt.Errorf("no running command with pid %d in sandbox %s: %w", n, sandbox, errdefs.ErrNotFound)
	}
	return c, nil
}

func (cs *commands) list(sandbox string) []CommandInfo {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.listLocked(sandbox)
}

// listLocked is list with cs.mu held.
func (cs *commands) listLocked(sandbox string) []CommandInfo {
	out := []CommandInfo{}
	for _, c := range cs.m[sandbox] {
		out = append(out, c.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// runningSandbox checks sandbox id, refusing one that is not running.
func (s *Server) runningSandbox(ctx context.Context, id string) error {
	c, err := s.be.Get(ctx, id)
	if err != nil {
		return err
	}
	if st := stateOf(c.Status); st != "running" {
		return fmt.Errorf("sandbox %s is %s: commands run in a running sandbox (POST /sandboxes/%s/connect resumes it): %w", id, st, id, errdefs.ErrConflict)
	}
	return nil
}

// runCommand starts a command and streams its output as NDJSON events until
// it exits or the client leaves (the process runs on: a background command).
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) error {
	var req CommandRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	// The stream may last: no read deadline (the client's leaving is seen by the server's background read).
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	c, err := s.startCommand(r.Context(), r.PathValue("sandboxID"), req, "")
	if err != nil {
		return err
	}
	return s.stream(w, r, c)
}

// startCommand checks req and starts it in running sandbox id, its events
// going to c.sub until the listener detaches (the process outlives ctx).
// tag is E2B's process tag ("" for none).
func (s *Server) startCommand(ctx context.Context, id string, req CommandRequest, tag string) (*command, error) {
	if req.Cmd == "" {
		return nil, invalid("field \"cmd\" is required")
	}
	var env []string
	for k, v := range req.Envs {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, invalid("field \"envs\": name %q is empty or holds '=' or NUL", k)
		}
		env = append(env, k+"="+v)
	}
	if err := s.runningSandbox(ctx, id); err != nil {
		return nil, err
	}
	c := &command{sub: make(chan Event), subGone: make(chan struct{}), tag: tag, envs: req.Envs}
	eio := ExecIO{Stdout: streamWriter{c, "stdout"}, Stderr: streamWriter{c, "stderr"}}
	if req.Stdin {
		pr, pw := io.Pipe()
		eio.Stdin, c.stdin = pr, pw
	}
	// The process outlives the request: its context is not the request's.
	p, err := s.be.Exec(context.WithoutCancel(ctx), id, ExecSpec{Cmd: req.Cmd, Args: req.Args, Env: env, Cwd: req.Cwd, User: req.User}, eio)
	if err != nil {
		return nil, err
	}
	c.proc, c.execID = p, p.ExecID()
	c.info = CommandInfo{Pid: p.Pid(), Cmd: req.Cmd, Args: req.Args, Cwd: req.Cwd, User: req.User, StartedAt: s.now().UTC()}
	if c.info.Args == nil {
		c.info.Args = []string{}
	}
	s.cmds.add(id, c)
	log := logOfCtx(ctx).WithFields(map[string]any{"sandbox": id, "pid": c.info.Pid})
	go func() {
		code, err := p.Wait(context.Background())
		s.cmds.remove(id, c)
		if c.stdin != nil {
			c.stdin.Close()
		}
		if err != nil {
			log.WithError(err).Warn("command: wait")
			c.emit(Event{Type: "error", Error: err.Error()})
			return
		}
		log.WithField("exit_code", code).Info("command exited")
		c.emit(Event{Type: "exit", ExitCode: &code})
	}()
	return c, nil
}

// stream writes c's events until its end, the client leaving or shutdown.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, c *command) error {
	defer c.detach()
	c.mu.Lock()
	sub := c.sub
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	_ = enc.Encode(Event{Type: "start", Pid: c.info.Pid})
	flush()
	for {
		select {
		case ev := <-sub:
			if err := enc.Encode(ev); err != nil {
				return nil // the client left
			}
			flush()
			if ev.Type == "exit" || ev.Type == "error" {
				return nil
			}
		case <-r.Context().Done():
			return nil
		case <-s.stop:
			return nil
		}
	}
}

// listCommands lists the running commands: those cube-api started and
// those the guest runs that a rollback brought back (or that ran before a
// restart of cube-api).
func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("sandboxID")
	c, err := s.be.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if stateOf(c.Status) == "running" {
		if err := s.syncCommands(r.Context(), id); err != nil {
			logOf(r).WithError(err).WithField("sandbox", id).Warn("commands: the guest's processes (the list shows those cube-api waits for)")
		}
	}
	writeJSON(w, http.StatusOK, s.cmds.list(id))
	return nil
}

func (s *Server) commandStdin(w http.ResponseWriter, r *http.Request) error {
	var req StdinRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	id := r.PathValue("sandboxID")
	c, err := s.command(r.Context(), id, r.PathValue("pid"))
	if err != nil {
		return err
	}
	if c.stdin == nil {
		return fmt.Errorf("command %d was started without \"stdin\": true: %w", c.info.Pid, errdefs.ErrFailedPrecondition)
	}
	if req.Data != "" {
		if _, err := io.WriteString(c.stdin, req.Data); err != nil {
			return fmt.Errorf("command %d's stdin: %v: %w", c.info.Pid, err, errdefs.ErrFailedPrecondition)
		}
	}
	if req.EOF {
		c.stdin.Close()
		// Closing the pipe ends the input: the process may read its EOF,
		// exit and be deleted before CloseStdin. It has its EOF then.
		if err := c.proc.CloseStdin(r.Context()); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// signals are the names …/kill takes.
var signals = map[string]syscall.Signal{
	"SIGKILL": syscall.SIGKILL, "SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGQUIT": syscall.SIGQUIT, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGSTOP": syscall.SIGSTOP,
	"SIGCONT": syscall.SIGCONT,
}

func (s *Server) killCommand(w http.ResponseWriter, r *http.Request) error {
	req := KillRequest{Signal: "SIGKILL"}
	if err := decode(r, &req, true); err != nil {
		return err
	}
	sig, ok := signals[strings.ToUpper(req.Signal)]
	if !ok {
		return invalid("field \"signal\": %q is not one of SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT", req.Signal)
	}
	c, err := s.command(r.Context(), r.PathValue("sandboxID"), r.PathValue("pid"))
	if err != nil {
		return err
	}
	if err := c.proc.Kill(r.Context(), sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
