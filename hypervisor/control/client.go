package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// MaxReply bounds one reply line the client reads (the largest, info's, is
// a few KiB); a longer one is refused, not buffered.
const MaxReply = 64 << 10

// RefusedError is the VMM's refusal of a request: the op was received and
// not done, for Reason (the VMM's error text).
type RefusedError struct {
	Op     string
	Reason string
}

func (e *RefusedError) Error() string { return "vmm refused " + e.Op + ": " + e.Reason }

// Client talks to a Server over one connection; its methods may be called
// from several goroutines (one request at a time goes out).
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	enc  *json.Encoder
	// broken is why the connection is out of step (a call whose reply was
	// not read whole, or cut short by its context): later calls fail.
	broken error
}

// Dial connects to the control socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("vmm control: dial %s: %w", path, err)
	}
	return &Client{conn: c, r: bufio.NewReaderSize(c, MaxReply), enc: json.NewEncoder(c)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends req and decodes the op's result into result (nil: the caller
// wants none). A refused op is a *RefusedError. ctx bounds the round trip; a
// call that failed on the connection or was cut short by ctx leaves the
// connection unusable (its reply may still come), so later calls fail: Dial
// again.
func (c *Client) Call(ctx context.Context, req Request, result any) error {
	resp, err := c.call(ctx, req)
	if err != nil {
		return err
	}
	return decodeResult(req.Op, resp.Result, result)
}

// call is one round trip, returning the VMM's accepting reply.
func (c *Client) call(ctx context.Context, req Request) (Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return Response{}, fmt.Errorf("vmm control %s: connection unusable since an earlier call failed (%v); dial again", req.Op, c.broken)
	}
	line, err := c.roundTrip(ctx, req)
	if err != nil {
		c.broken = err
		return Response{}, fmt.Errorf("vmm control %s: %w", req.Op, err)
	}
	return parseReply(req.Op, line)
}

// roundTrip writes req and reads one reply line, within ctx.
func (c *Client) roundTrip(ctx context.Context, req Request) ([]byte, error) {
	// Ordering: the deadline and the cancel hook are set before the write,
	// so that neither the write nor the read outlives ctx.
	dl, _ := ctx.Deadline() // the zero time: none
	if err := c.conn.SetDeadline(dl); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	line, err := c.exchange(req)
	if !stop() {
		// The hook ran or is running: it may yet move the deadline under a
		// later call, so this connection is done with.
		c.broken = fmt.Errorf("a call was cut short: %w", context.Cause(ctx))
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The only deadlines set are ctx's.
		cause := context.Cause(ctx)
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		err = fmt.Errorf("%w: %w", cause, err)
	}
	return line, err
}

func (c *Client) exchange(req Request) ([]byte, error) {
	if err := c.enc.Encode(req); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	line, err := c.r.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("reply longer than %d bytes", MaxReply)
	case err != nil:
		return nil, fmt.Errorf("read reply: %w", err)
	}
	return line, nil
}

// parseReply decodes one reply line (at most MaxReply bytes, from the VMM:
// not trusted to be well-formed) to op; a refusal is a *RefusedError.
func parseReply(op string, line []byte) (Response, error) {
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("vmm control %s: bad reply: %w", op, err)
	}
	if !resp.OK {
		reason := resp.Error
		if reason == "" {
			reason = "no reason given"
		}
		return Response{}, &RefusedError{Op: op, Reason: reason}
	}
	return resp, nil
}

// decodeResult decodes an accepted op's payload into v (nil: not wanted).
func decodeResult(op string, payload json.RawMessage, v any) error {
	if v == nil {
		return nil
	}
	if len(payload) == 0 || bytes.Equal(payload, []byte("null")) {
		return fmt.Errorf("vmm control %s: the reply has no result (a VMM of another version?)", op)
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("vmm control %s: bad result: %w", op, err)
	}
	return nil
}

// Pause parks the vCPUs.
func (c *Client) Pause(ctx context.Context) error { return c.Call(ctx, Request{Op: OpPause}, nil) }

// Resume runs them again.
func (c *Client) Resume(ctx context.Context) error { return c.Call(ctx, Request{Op: OpResume}, nil) }

// Stop ends the VM; the VMM answers first, then exits (a reply lost to its
// exit reads as io.EOF).
func (c *Client) Stop(ctx context.Context) error { return c.Call(ctx, Request{Op: OpStop}, nil) }

// Info decodes the info op's payload into v.
func (c *Client) Info(ctx context.Context, v any) error {
	resp, err := c.call(ctx, Request{Op: OpInfo})
	if err != nil {
		return err
	}
	return decodeResult(OpInfo, resp.Info, v)
}

// Snapshot asks for a snapshot into dir (absolute, not yet existing).
func (c *Client) Snapshot(ctx context.Context, dir string, incremental bool) (SnapshotResult, error) {
	var r SnapshotResult
	err := c.Call(ctx, Request{Op: OpSnapshot, Dir: dir, Incremental: incremental}, &r)
	return r, err
}

// Rollback asks the VM to roll back in place to the snapshot in dir.
func (c *Client) Rollback(ctx context.Context, dir string) (RollbackResult, error) {
	var r RollbackResult
	err := c.Call(ctx, Request{Op: OpRollback, Dir: dir}, &r)
	return r, err
}

// Restore asks a standby VMM to restore the snapshot in dir and run it (or
// keep its vCPUs parked with paused); the socket then controls that VM.
func (c *Client) Restore(ctx context.Context, dir string, paused bool) (RestoreResult, error) {
	var r RestoreResult
	err := c.Call(ctx, Request{Op: OpRestore, Dir: dir, Paused: paused}, &r)
	return r, err
}

// SetDisk asks the VMM to re-point the drive with serial at the backing
// file path (absolute).
func (c *Client) SetDisk(ctx context.Context, serial, path string) (DiskSetResult, error) {
	var r DiskSetResult
	err := c.Call(ctx, Request{Op: OpDiskSet, Serial: serial, Path: path}, &r)
	return r, err
}

// SetDiskReadOnly is SetDisk with a read-only medium: the VMM opens path
// read-only and fails the guest's writes to it with IOERR.
func (c *Client) SetDiskReadOnly(ctx context.Context, serial, path string) (DiskSetResult, error) {
	var r DiskSetResult
	err := c.Call(ctx, Request{Op: OpDiskSet, Serial: serial, Path: path, ReadOnly: true}, &r)
	return r, err
}
