package cube

import (
	"context"
	"errors"
	"fmt"
)

// ForkOptions say how to fork a sandbox.
type ForkOptions struct {
	// Timeout of the new sandboxes in seconds (0: the server's default).
	Timeout int
	// AllOrNothing: when one sandbox fails, the ones made are deleted.
	AllOrNothing bool
}

// ForkItem is one sandbox of a fork: Sandbox, or Err why it is missing.
type ForkItem struct {
	Sandbox *Sandbox
	Err     *APIError
}

type forkItemJSON struct {
	Sandbox *SandboxInfo `json:"sandbox"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Fork makes count sandboxes (1..100) from this one's state now: its
// processes, memory and disk (server-side: one temporary snapshot, deleted
// before the answer). One item per sandbox, in order; the source runs on.
func (s *Sandbox) Fork(ctx context.Context, count int, o ForkOptions) ([]ForkItem, error) {
	var raw []forkItemJSON
	body := map[string]any{"count": count, "timeout": o.Timeout, "allOrNothing": o.AllOrNothing}
	if _, err := s.c.call(ctx, "POST", s.path("/fork"), nil, body, &raw); err != nil {
		return nil, err
	}
	out := make([]ForkItem, len(raw))
	for i, it := range raw {
		switch {
		case it.Sandbox != nil:
			out[i].Sandbox = s.c.handle(*it.Sandbox)
		case it.Error != nil:
			out[i].Err = &APIError{Status: it.Error.Code, Code: it.Error.Code, Message: it.Error.Message}
		default:
			out[i].Err = &APIError{Message: "cube-api: a fork item with neither sandbox nor error"}
		}
	}
	return out, nil
}

// CloneError is Clone's failure: the sandboxes made were deleted.
type CloneError struct {
	// Errs are the items' errors.
	Errs []error
}

func (e *CloneError) Error() string {
	return fmt.Sprintf("cube-api: clone: %d of the sandboxes failed, none is kept: %v", len(e.Errs), errors.Join(e.Errs...))
}

func (e *CloneError) Unwrap() []error { return e.Errs }

// Clone makes n sandboxes from this one's state now, all or nothing: on any
// failure none is kept (the server deletes the ones it made; any it
// returned are killed here) and a *CloneError says why. The temporary
// snapshot is the server's and is always deleted there (a crash of the
// client leaks nothing). concurrency (0: n) bounds how many are made at
// once; cube-api makes a fork's sandboxes one after another, so it is
// checked (1..n) and otherwise advisory.
func (s *Sandbox) Clone(ctx context.Context, n, concurrency int, timeout int) ([]*Sandbox, error) {
	if n < 1 {
		return nil, fmt.Errorf("cube-api: clone: n=%d: want at least 1", n)
	}
	if concurrency < 0 || concurrency > n {
		return nil, fmt.Errorf("cube-api: clone: concurrency=%d: want 1..%d (0: n)", concurrency, n)
	}
	items, err := s.Fork(ctx, n, ForkOptions{Timeout: timeout, AllOrNothing: true})
	if err != nil {
		return nil, err
	}
	var made []*Sandbox
	var errs []error
	for _, it := range items {
		if it.Err != nil {
			errs = append(errs, it.Err)
		} else {
			made = append(made, it.Sandbox)
		}
	}
	if len(errs) == 0 && len(made) == n {
		return made, nil
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("cube-api: fork answered %d sandboxes, want %d", len(made), n))
	}
	for _, sb := range made {
		if kerr := sb.Kill(context.WithoutCancel(ctx)); kerr != nil && !IsNotFound(kerr) {
			errs = append(errs, fmt.Errorf("kill clone %s: %w", sb.ID, kerr))
		}
	}
	return nil, &CloneError{Errs: errs}
}
