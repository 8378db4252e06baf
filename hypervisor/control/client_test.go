package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rawServer answers every request line on the socket with reply(line).
func rawServer(t *testing.T, reply func(line string) string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "raw.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, reply(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return path
}

func dialT(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A reply longer than MaxReply is refused without buffering it, and the
// connection (out of step now) refuses later calls instead of misreading.
func TestClientBoundsTheReply(t *testing.T) {
	path := rawServer(t, func(string) string {
		return `{"ok":true,"info":"` + strings.Repeat("x", 2*MaxReply) + "\"}\n"
	})
	c := dialT(t, path)
	var v any
	if err := c.Info(t.Context(), &v); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("oversized reply: %v", err)
	}
	if err := c.Pause(t.Context()); err == nil || !strings.Contains(err.Error(), "dial again") {
		t.Fatalf("call after a broken reply: %v", err)
	}
}

// ctx bounds a call to a VMM that never answers; the connection is then unusable.
func TestClientHonoursContext(t *testing.T) {
	silent := make(chan struct{})
	t.Cleanup(func() { close(silent) })
	path := rawServer(t, func(string) string { <-silent; return "" })
	c := dialT(t, path)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Pause(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent VMM: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the call took %v past its context", d)
	}
	cctx, ccancel := context.WithCancel(t.Context())
	ccancel()
	if err := c.Resume(cctx); err == nil || !strings.Contains(err.Error(), "dial again") {
		t.Fatalf("call after a cut-short one: %v", err)
	}
	c2 := dialT(t, path)
	if err := c2.Resume(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("call with a cancelled context: %v", err)
	}
}

// A refusal is a *RefusedError carrying the op and the VMM's reason; a reply
// the client cannot use is an error naming the op, never a zero result.
func TestClientReplies(t *testing.T) {
	replies := map[string]string{
		OpPause:    `{"ok":false,"error":"machine is stopped"}` + "\n",
		OpResume:   `{"ok":false}` + "\n",
		OpSnapshot: `{"ok":true}` + "\n",
		OpRollback: `{"ok":true,"result":{"memory":7}}` + "\n",
		OpRestore:  `{"ok":true,"result":{"dir":"/s","took_ms":1.5,"paused":true,"new":1}}` + "\n",
		OpStop:     "not json\n",
	}
	path := rawServer(t, func(line string) string {
		var req Request
		json.Unmarshal([]byte(line), &req)
		return replies[req.Op]
	})
	ctx := t.Context()
	var ref *RefusedError
	if err := dialT(t, path).Pause(ctx); !errors.As(err, &ref) || ref.Op != OpPause || ref.Reason != "machine is stopped" {
		t.Errorf("refusal: %v", err)
	}
	if err := dialT(t, path).Resume(ctx); !errors.As(err, &ref) || ref.Reason == "" {
		t.Errorf("refusal without a reason: %v", err)
	}
	if _, err := dialT(t, path).Snapshot(ctx, "/s", false); err == nil || !strings.Contains(err.Error(), "no result") {
		t.Errorf("accepted without a result: %v", err)
	}
	if _, err := dialT(t, path).Rollback(ctx, "/s"); err == nil || !strings.Contains(err.Error(), "bad result") {
		t.Errorf("result of the wrong shape: %v", err)
	}
	if r, err := dialT(t, path).Restore(ctx, "/s", true); err != nil || r != (RestoreResult{Dir: "/s", TookMS: 1.5, Paused: true}) {
		t.Errorf("restore result (an unknown field is ignored): %+v %v", r, err)
	}
	if err := dialT(t, path).Stop(ctx); err == nil || !strings.Contains(err.Error(), "vmm control stop: bad reply") || errors.As(err, &ref) {
		t.Errorf("garbage reply: %v", err)
	}
}

// The server refuses a relative file or directory before the op runs, naming
// the field and the fix.
func TestServerRefusesRelativePaths(t *testing.T) {
	vm := &fakeSnapVM{fakeVM: fakeVM{state: "running", stopped: make(chan struct{})}}
	s := &Server{target: vm}
	for _, req := range []Request{
		{Op: OpSnapshot, Dir: "snaps/a"},
		{Op: OpRollback, Dir: "./a"},
		{Op: OpRestore, Dir: "a"},
		{Op: OpDiskSet, Serial: "cube-slot-1", Path: "img/a.img"},
		{Op: OpPause, Dir: "a"},
	} {
		line, _ := json.Marshal(req)
		resp, _ := s.handle(line)
		field := "dir"
		if req.Path != "" {
			field = "path"
		}
		if resp.OK || !strings.Contains(resp.Error, field+" \"") || !strings.Contains(resp.Error, "not absolute") ||
			!strings.Contains(resp.Error, "send an absolute "+field) {
			t.Errorf("%+v: %+v", req, resp)
		}
	}
	if len(vm.ops) != 0 {
		t.Errorf("the target ran %v", vm.ops)
	}
	if resp, _ := s.handle([]byte(`{"op":"bogus","dir":"rel"}`)); !strings.Contains(resp.Error, "unknown op") {
		t.Errorf("unknown op with a relative dir: %+v", resp)
	}
}

// FuzzDecodeReply feeds arbitrary reply lines (what a VMM, trusted or not,
// may send) to the client's decoding: it never panics, accepts only a reply
// that says ok, and a refusal always carries a reason.
func FuzzDecodeReply(f *testing.F) {
	for _, s := range []string{`{"ok":true}`, `{"ok":false,"error":"no"}`, `{"ok":true,"info":{}}`, ``, `{"ok":1}`, `null`,
		`{"ok":true,"result":{"dir":"/s","frozen_ms":1e308,"memory_bytes":-1}}`, `{"ok":true,"result":null}`,
		`{"ok":true,"result":[1,2]}`, `{"ok":false,"error":""}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > MaxReply {
			return // the client never reads more
		}
		resp, err := parseReply(OpSnapshot, b)
		var ref *RefusedError
		switch {
		case err == nil && !strings.Contains(string(b), "true"):
			t.Fatalf("accepted %q", b)
		case errors.As(err, &ref) && ref.Reason == "":
			t.Fatalf("refusal without a reason for %q", b)
		case err != nil:
			return
		}
		var r SnapshotResult
		if err := decodeResult(OpSnapshot, resp.Result, &r); err == nil && len(resp.Result) == 0 {
			t.Fatalf("a result decoded from nothing in %q", b)
		}
	})
}
