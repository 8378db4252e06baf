package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// events runs a command and returns its stream's events.
func (e *env) events(id string, body any) []Event {
	e.t.Helper()
	resp, b := e.do("POST", "/sandboxes/"+id+"/commands", body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		e.t.Fatalf("run: %d %s", resp.StatusCode, b)
	}
	var evs []Event
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			e.t.Fatalf("line %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// output joins the data of the events of type typ.
func output(evs []Event, typ string) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == typ {
			b.WriteString(ev.Data)
		}
	}
	return b.String()
}

func TestCommandRun(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	evs := e.events(id, map[string]any{"cmd": "echo", "args": []string{"hello", "world"}, "envs": map[string]string{"X": "1"}})
	last := evs[len(evs)-1]
	if evs[0].Type != "start" || evs[0].Pid == 0 || output(evs, "stdout") != "hello world X=1\n" || last.Type != "exit" || *last.ExitCode != 0 {
		t.Errorf("echo: %+v", evs)
	}
	evs = e.events(id, map[string]any{"cmd": "fail"})
	last = evs[len(evs)-1]
	if output(evs, "stderr") != "boom\n" || output(evs, "stdout") != "out\n" || *last.ExitCode != 3 {
		t.Errorf("fail: %+v", evs)
	}
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{}, 400, `"cmd" is required`)
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "echo", "args": "x"}, 400, `"args"`, "an array")
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "echo", "envs": map[string]string{"": "x"}}, 400, `"envs"`)
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "echo", "user": "bob"}, 400, `"user"`)
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "echo", "tty": true}, 400, `unknown field "tty"`)
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "nonexistent"}, 409, "no such file")
	e.wantError("POST", "/sandboxes/nope/commands", map[string]any{"cmd": "echo"}, 404)
	e.want("POST", "/sandboxes/"+id+"/pause", nil, 204, nil)
	e.wantError("POST", "/sandboxes/"+id+"/commands", map[string]any{"cmd": "echo"}, 409, "paused", "connect")
}

// startStream starts a command and returns its first event and the open stream.
func (e *env) startStream(id string, body string) (Event, *bufio.Scanner, func()) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+"/sandboxes/"+id+"/commands", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		e.t.Fatalf("start: %v %v", err, resp)
	}
	sc := bufio.NewScanner(resp.Body)
	var ev Event
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Type != "start" {
		e.t.Fatalf("first line %q", sc.Text())
	}
	return ev, sc, func() { resp.Body.Close() }
}

func TestCommandStdinKillList(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	cat, sc, closeCat := e.startStream(id, `{"cmd":"cat","stdin":true}`)
	defer closeCat()
	sleep, _, closeSleep := e.startStream(id, `{"cmd":"sleep","args":["1000"],"cwd":"/tmp"}`)
	var l []CommandInfo
	e.want("GET", "/sandboxes/"+id+"/commands", nil, 200, &l)
	if len(l) != 2 || l[0].Pid != cat.Pid || l[1].Pid != sleep.Pid || l[1].Cmd != "sleep" || l[1].Cwd != "/tmp" || l[1].Args[0] != "1000" {
		t.Fatalf("list: %+v", l)
	}
	catPath := fmt.Sprintf("/sandboxes/%s/commands/%d", id, cat.Pid)
	e.want("POST", catPath+"/stdin", map[string]any{"data": "line one\n"}, 204, nil)
	var ev Event
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Type != "stdout" || ev.Data != "line one\n" {
		t.Fatalf("echoed %q", sc.Text())
	}
	e.want("POST", catPath+"/stdin", map[string]any{"eof": true}, 204, nil)
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Type != "exit" || *ev.ExitCode != 0 {
		t.Fatalf("after EOF %q", sc.Text())
	}
	// The client of sleep leaves: a background command runs on, is listed, and is killed.
	closeSleep()
	sleepPath := fmt.Sprintf("/sandboxes/%s/commands/%d", id, sleep.Pid)
	e.wantError("POST", sleepPath+"/stdin", map[string]any{"data": "x"}, 409, "without \"stdin\"")
	e.wantError("POST", sleepPath+"/kill", map[string]any{"signal": "SIGNOPE"}, 400, `"signal"`)
	e.want("POST", sleepPath+"/kill", map[string]any{"signal": "sigterm"}, 204, nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.want("GET", "/sandboxes/"+id+"/commands", nil, 200, &l)
		if len(l) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running after kill: %+v", l)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.wantError("POST", sleepPath+"/kill", nil, 404, "no running command")
	e.wantError("POST", sleepPath+"/stdin", map[string]any{"data": "x"}, 404)
	e.wantError("POST", "/sandboxes/"+id+"/commands/abc/kill", nil, 400, `"pid"`)
	e.wantError("GET", "/sandboxes/nope/commands", nil, 404)
	e.wantError("POST", catPath+"/stdin", `{"data": 1}`, 400, `"data"`)
}

func TestShutdownEndsStreams(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(nil).SandboxID
	_, sc, done := e.startStream(id, `{"cmd":"sleep"}`)
	defer done()
	e.s.Stop()
	ended := make(chan bool)
	go func() { ended <- !sc.Scan() }()
	select {
	case ok := <-ended:
		if !ok {
			t.Errorf("more after Stop: %q", sc.Text())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream not ended by Stop")
	}
	var l []CommandInfo
	e.want("GET", "/sandboxes/"+id+"/commands", nil, 200, &l)
	if len(l) != 1 {
		t.Errorf("the command should run on: %+v", l)
	}
}
