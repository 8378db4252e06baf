package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

func ask(t *testing.T, sock, cmd string) State {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, cmd)
	var s State
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&s); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return s
}

func TestServeHoldRelease(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "w.sock")
	go serve(sock)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("worker never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	held := ask(t, sock, "hold")
	time.Sleep(350 * time.Millisecond)
	again := ask(t, sock, "query")
	if !held.Held || again.Counter != held.Counter || again.Identity != held.Identity || len(held.Identity) != 32 {
		t.Fatalf("held worker moved: %+v then %+v", held, again)
	}
	if again.Digest != Digest(again.Identity, again.Counter) || Digest("a", 1) == Digest("a", 2) {
		t.Fatalf("digest %s does not match", again.Digest)
	}
	ask(t, sock, "release")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s := ask(t, sock, "query"); s.Counter > held.Counter && !s.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("released worker does not count")
		}
	}
}
