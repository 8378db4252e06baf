package stdio

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// Through a rollback the client's fifos stay open while the guest streams
// die; output and stdin go on through the re-attached streams.
func TestReattachKeepsTheFifos(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := newClientFifos(t, ctx, true)
	hio, err := Open(ctx, "c1", "default", cl.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hio.Close()
	hostIn, guestIn := socketPair(t)
	hostOut, guestOut := socketPair(t)
	hostErr, guestErr := socketPair(t)
	hio.Attach(hostIn, hostOut, hostErr)
	out := bufio.NewReader(cl.stdout)
	io.WriteString(guestOut, "before\n")
	if l, _ := out.ReadString('\n'); l != "before\n" {
		t.Fatalf("stdout %q", l)
	}

	// The transport reset: every guest stream ends.
	hio.Hold()
	guestIn.Close()
	guestOut.Close()
	guestErr.Close()
	time.Sleep(50 * time.Millisecond) // the pumps see the ends
	io.WriteString(cl.stdin, "typed during the rollback\n")

	hostIn2, guestIn2 := socketPair(t)
	hostOut2, guestOut2 := socketPair(t)
	hostErr2, guestErr2 := socketPair(t)
	hio.Reattach(hostIn2, hostOut2, hostErr2)
	io.WriteString(guestOut2, "after\n")
	if l, _ := out.ReadString('\n'); l != "after\n" {
		t.Fatalf("stdout after re-attaching: %q (the fifo was closed?)", l)
	}
	in := bufio.NewReader(guestIn2)
	if l, _ := in.ReadString('\n'); l != "typed during the rollback\n" {
		t.Fatalf("stdin after re-attaching: %q", l)
	}
	// EOF still travels: the guest's end of output closes the fifo.
	guestOut2.Close()
	guestErr2.Close()
	rest, _ := io.ReadAll(out)
	if len(rest) != 0 {
		t.Fatalf("stdout rest %q", rest)
	}
	cl.stdin.Close()
	if l, err := in.ReadString('\n'); err != io.EOF || l != "" {
		t.Fatalf("stdin EOF: %q %v", l, err)
	}
}

// A hold released without a rollback closes what ended meanwhile.
func TestReleaseClosesEndedStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := newClientFifos(t, ctx, false)
	hio, err := Open(ctx, "c1", "default", cl.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hio.Close()
	hostOut, guestOut := socketPair(t)
	hostErr, guestErr := socketPair(t)
	hio.Attach(nil, hostOut, hostErr)
	hio.Hold()
	io.WriteString(guestOut, "last words")
	guestOut.Close()
	guestErr.Close()
	time.Sleep(50 * time.Millisecond)
	hio.Release()
	got, _ := io.ReadAll(cl.stdout)
	if !strings.Contains(string(got), "last words") {
		t.Fatalf("stdout %q", got)
	}
	if err := hio.WaitOutput(ctx); err != nil {
		t.Fatal(err)
	}
}
