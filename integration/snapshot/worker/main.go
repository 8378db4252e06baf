// Command worker is the guest workload of the snapshot e2e test (a static binary in the container's rootfs).
//
//	worker serve SOCKET          count in memory every 100 ms; answer on the Unix socket SOCKET
//	worker SOCKET query|hold|release|time
//
// The server draws a random identity at start and keeps its counter only in memory, so a restored snapshot
// can be told apart from a restarted worker. Each request is one line; the answer is one JSON line:
// {"counter","held","identity","pid","digest"} with digest = hex(sha256(identity || 0x00 || decimal counter)),
// plus the guest's wall clock ("now_unix_nano", for the clock-step check; not part of the state).
package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// State is the worker's answer.
type State struct {
	Counter     int64  `json:"counter"`
	Held        bool   `json:"held"`
	Identity    string `json:"identity"`
	PID         int    `json:"pid"`
	Digest      string `json:"digest"`
	NowUnixNano int64  `json:"now_unix_nano"`
}

// Digest is the worker's proof that counter and identity belong together.
func Digest(identity string, counter int64) string {
	s := sha256.Sum256([]byte(identity + "\x00" + strconv.FormatInt(counter, 10)))
	return hex.EncodeToString(s[:])
}

type worker struct {
	mu       sync.Mutex
	counter  int64
	held     bool
	identity string
}

func (w *worker) state() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return State{Counter: w.counter, Held: w.held, Identity: w.identity, PID: os.Getpid(),
		Digest: Digest(w.identity, w.counter), NowUnixNano: time.Now().UnixNano()}
}

func (w *worker) handle(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	switch cmd := strings.TrimSpace(line); cmd {
	case "hold", "release":
		w.mu.Lock()
		w.held = cmd == "hold"
		w.mu.Unlock()
	case "query", "time":
	default:
		fmt.Fprintf(c, "{\"error\":%q}\n", "unknown command "+cmd)
		return
	}
	json.NewEncoder(c).Encode(w.state())
}

func serve(sock string) error {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	w := &worker{identity: hex.EncodeToString(id)}
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	go func() {
		for range time.Tick(100 * time.Millisecond) {
			w.mu.Lock()
			if !w.held {
				w.counter++
			}
			w.mu.Unlock()
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go w.handle(c)
	}
}

func request(sock, cmd string) error {
	c, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(c, cmd); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	_, err = os.Stdout.WriteString(line)
	return err
}

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "serve":
		err = serve(os.Args[2])
	case len(os.Args) == 3:
		err = request(os.Args[1], os.Args[2])
	default:
		err = fmt.Errorf("usage: worker serve SOCKET | worker SOCKET query|hold|release|time")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
