package cube

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Commands runs commands in a sandbox.
type Commands struct{ s *Sandbox }

// RunOptions tune a command.
type RunOptions struct {
	// Args, when not nil, run Run's cmd as a program with these arguments;
	// otherwise cmd is a shell command line (/bin/sh -c cmd).
	Args []string
	Envs map[string]string
	Cwd  string
	// User is root, UID or UID:GID.
	User string
	// Stdin keeps stdin open for SendStdin/CloseStdin.
	Stdin bool
	// OnStdout and OnStderr get the output as it comes.
	OnStdout, OnStderr func(string)
}

// CommandResult is a finished command.
type CommandResult struct {
	ExitCode int
	Stdout   string
	Stderr   string
	Error    string // the server's error, when waiting failed
}

// CommandExitError is a command that exited non-zero.
type CommandExitError struct{ Result CommandResult }

func (e *CommandExitError) Error() string {
	return fmt.Sprintf("command exited with code %d: %s", e.Result.ExitCode, strings.TrimSpace(e.Result.Stderr))
}

// CommandInfo is a running command as listed.
type CommandInfo struct {
	Pid  uint32   `json:"pid"`
	Cmd  string   `json:"cmd"`
	Args []string `json:"args"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
}

// event is a line of the output stream.
type event struct {
	Type     string `json:"type"`
	Pid      uint32 `json:"pid"`
	Data     string `json:"data"`
	ExitCode *int   `json:"exitCode"`
	Error    string `json:"error"`
}

// CommandHandle is a started command (background mode).
type CommandHandle struct {
	Pid  uint32
	s    *Sandbox
	body io.ReadCloser
	done chan struct{}
	mu   sync.Mutex
	res  CommandResult
	err  error
}

// Run runs cmd and waits for it: a non-zero exit is a *CommandExitError
// (with the result).
func (c *Commands) Run(ctx context.Context, cmd string, o RunOptions) (CommandResult, error) {
	h, err := c.Start(ctx, cmd, o)
	if err != nil {
		return CommandResult{}, err
	}
	return h.Wait()
}

// Start starts cmd and returns once it runs (background mode): the output
// goes to the callbacks and into the result of Wait. Disconnect leaves it
// running in the sandbox; Kill ends it.
func (c *Commands) Start(ctx context.Context, cmd string, o RunOptions) (*CommandHandle, error) {
	body := map[string]any{"cmd": cmd, "stdin": o.Stdin}
	if o.Args == nil {
		body["cmd"], body["args"] = "/bin/sh", []string{"-c", cmd}
	} else {
		body["args"] = o.Args
	}
	if o.Envs != nil {
		body["envs"] = o.Envs
	}
	if o.Cwd != "" {
		body["cwd"] = o.Cwd
	}
	if o.User != "" {
		body["user"] = o.User
	}
	resp, err := c.s.c.send(ctx, "POST", c.s.path("/commands"), nil, body)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var start event
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &start) != nil || start.Type != "start" {
		resp.Body.Close()
		return nil, fmt.Errorf("cube-api: command stream did not start: %q %v", sc.Text(), sc.Err())
	}
	h := &CommandHandle{Pid: start.Pid, s: c.s, body: resp.Body, done: make(chan struct{})}
	go h.read(sc, o)
	return h, nil
}

// read consumes the stream until the exit event.
func (h *CommandHandle) read(sc *bufio.Scanner, o RunOptions) {
	defer close(h.done)
	defer h.body.Close()
	var out, errOut strings.Builder
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			h.finish(CommandResult{}, fmt.Errorf("cube-api: command stream: %q: %w", sc.Text(), err))
			return
		}
		switch ev.Type {
		case "stdout":
			out.WriteString(ev.Data)
			if o.OnStdout != nil {
				o.OnStdout(ev.Data)
			}
		case "stderr":
			errOut.WriteString(ev.Data)
			if o.OnStderr != nil {
				o.OnStderr(ev.Data)
			}
		case "exit", "error":
			res := CommandResult{Stdout: out.String(), Stderr: errOut.String(), Error: ev.Error}
			if ev.ExitCode != nil {
				res.ExitCode = *ev.ExitCode
			}
			switch {
			case ev.Type == "error":
				h.finish(res, fmt.Errorf("cube-api: command %d: %s", h.Pid, ev.Error))
			case res.ExitCode != 0:
				h.finish(res, &CommandExitError{Result: res})
			default:
				h.finish(res, nil)
			}
			return
		}
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	h.finish(CommandResult{Stdout: out.String(), Stderr: errOut.String()}, fmt.Errorf("cube-api: command %d: the stream ended before its exit: %w", h.Pid, err))
}

func (h *CommandHandle) finish(r CommandResult, err error) {
	h.mu.Lock()
	h.res, h.err = r, err
	h.mu.Unlock()
}

// Wait waits for the command's exit.
func (h *CommandHandle) Wait() (CommandResult, error) {
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.res, h.err
}

// Disconnect stops reading the output; the command runs on.
func (h *CommandHandle) Disconnect() { h.body.Close() }

// Kill sends SIGKILL (or signal, e.g. "SIGTERM").
func (h *CommandHandle) Kill(ctx context.Context, signal ...string) error {
	var body any
	if len(signal) > 0 {
		body = map[string]string{"signal": signal[0]}
	}
	return h.s.Commands.Kill(ctx, h.Pid, body)
}

// SendStdin writes data to the command's stdin (started with Stdin).
func (h *CommandHandle) SendStdin(ctx context.Context, data string) error {
	_, err := h.s.c.call(ctx, "POST", h.s.path(fmt.Sprintf("/commands/%d/stdin", h.Pid)), nil, map[string]any{"data": data}, nil)
	return err
}

// CloseStdin closes the command's stdin.
func (h *CommandHandle) CloseStdin(ctx context.Context) error {
	_, err := h.s.c.call(ctx, "POST", h.s.path(fmt.Sprintf("/commands/%d/stdin", h.Pid)), nil, map[string]any{"eof": true}, nil)
	return err
}

// Kill signals the command pid (body: nil for SIGKILL).
func (c *Commands) Kill(ctx context.Context, pid uint32, body any) error {
	_, err := c.s.c.call(ctx, "POST", c.s.path(fmt.Sprintf("/commands/%d/kill", pid)), nil, body, nil)
	return err
}

// List returns the running commands.
func (c *Commands) List(ctx context.Context) ([]CommandInfo, error) {
	var out []CommandInfo
	_, err := c.s.c.call(ctx, "GET", c.s.path("/commands"), nil, nil, &out)
	return out, err
}

// IsExitError says whether err is a non-zero exit, and returns its result.
func IsExitError(err error) (CommandResult, bool) {
	var e *CommandExitError
	if errors.As(err, &e) {
		return e.Result, true
	}
	return CommandResult{}, false
}
