package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// freshenOnce is an agent with Freshen: it records the request.
type freshenOnce struct {
	AgentClient
	got   []FreshenRequest
	err   error
	mount MountedDisk
}

func (a *freshenOnce) Freshen(ctx context.Context, req FreshenRequest) (MountedDisk, error) {
	a.got = append(a.got, req)
	return a.mount, a.err
}

// A restored guest is freshened in one call (no SetTime, no ReseedRandom:
// the embedded nil client would panic), and its error says what failed.
func TestFreshenOneCall(t *testing.T) {
	ctx := context.Background()
	a := &freshenOnce{}
	before := time.Now()
	if err := freshenRestoredGuest(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if len(a.got) != 1 || a.got[0].Time.Before(before) || len(a.got[0].Entropy) != 64 || a.got[0].Mount != nil {
		t.Fatalf("Freshen calls %+v: want one, time after %v, 64 bytes of entropy, no mount", a.got, before)
	}
	a = &freshenOnce{err: errors.New("set clock: EPERM")}
	if err := freshenRestoredGuest(ctx, a, nil); err == nil || !strings.Contains(err.Error(), "freshen the restored guest: set clock: EPERM") {
		t.Fatalf("freshen error: %v", err)
	}
}

// freshenAgent answers SetTime only once ReseedRandom has been called (and
// the other way round): freshenRestoredGuest must have both in flight at
// once, or it waits out the deadline.
type freshenAgent struct {
	AgentClient
	timeIn, rngIn    chan struct{}
	timeErr, rngErr  error
	gotTime          time.Time
	gotEntropyLength int
}

func (a *freshenAgent) SetTime(ctx context.Context, t time.Time) error {
	close(a.timeIn)
	a.gotTime = t
	select {
	case <-a.rngIn:
		return a.timeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *freshenAgent) ReseedRandom(ctx context.Context, entropy []byte) error {
	close(a.rngIn)
	a.gotEntropyLength = len(entropy)
	select {
	case <-a.timeIn:
		return a.rngErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Freshen answers as an agent that predates the call.
func (a *freshenAgent) Freshen(ctx context.Context, req FreshenRequest) (MountedDisk, error) {
	return MountedDisk{}, fmt.Errorf("older agent: %w", errdefs.ErrNotImplemented)
}

// An agent without Freshen gets SetTime and ReseedRandom, both in flight at once.
func TestFreshenOlderAgentIssuesBothCallsTogether(t *testing.T) {
	newAgent := func() *freshenAgent { return &freshenAgent{timeIn: make(chan struct{}), rngIn: make(chan struct{})} }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := newAgent()
	before := time.Now()
	if err := freshenRestoredGuest(ctx, a, nil); err != nil {
		t.Fatalf("freshen: %v (one call waited for the other)", err)
	}
	if a.gotTime.Before(before) || a.gotEntropyLength != 64 {
		t.Errorf("time %v (before %v), %d bytes of entropy", a.gotTime, before, a.gotEntropyLength)
	}
	for _, c := range []struct {
		timeErr, rngErr error
		want            string
	}{
		{errors.New("clock"), nil, "set guest time: clock"},
		{nil, errors.New("pool"), "reseed guest rng: pool"},
		{errors.New("clock"), errors.New("pool"), "set guest time: clock"},
	} {
		a := newAgent()
		a.timeErr, a.rngErr = c.timeErr, c.rngErr
		if err := freshenRestoredGuest(ctx, a, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("errors %v, %v: freshen %v, want %q", c.timeErr, c.rngErr, err, c.want)
		}
	}
}
