package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	fspb "github.com/cube-runtime/cube/checkpoint/api/envdpb/filesystem"
	pb "github.com/cube-runtime/cube/checkpoint/api/envdpb/process"
)

const envdKeyForTests = "envd-test-key-0123456789"

// envdHeaders are what E2B's SDK sends to envd for sandbox id (with its token).
func (e *env) envdHeaders(id string) http.Header {
	h := http.Header{}
	h.Set(EnvdSandboxHeader, id)
	h.Set("E2b-Sandbox-Port", "49983")
	if tok := e.s.envdToken(id); tok != "" {
		h.Set(EnvdTokenHeader, tok)
	}
	return h
}

// envdClient is a Connect client of procedure (JSON like E2B's JS SDK, or binary proto).
func envdClient[Req, Res any](e *env, procedure string, json bool) *connect.Client[Req, Res] {
	var opts []connect.ClientOption
	if json {
		opts = append(opts, connect.WithProtoJSON())
	}
	return connect.NewClient[Req, Res](http.DefaultClient, e.srv.URL+procedure, opts...)
}

func withHeaders[T any](msg *T, h http.Header) *connect.Request[T] {
	r := connect.NewRequest(msg)
	for k, v := range h {
		r.Header()[k] = v
	}
	return r
}

// run starts a command through process.Process/Start and collects its events.
func (e *env) envdRun(id string, json bool, msg *pb.StartRequest) (pid uint32, stdout, stderr string, end *pb.ProcessEvent_EndEvent, err error) {
	c := envdClient[pb.StartRequest, pb.StartResponse](e, "/process.Process/Start", json)
	st, err := c.CallServerStream(context.Background(), withHeaders(msg, e.envdHeaders(id)))
	if err != nil {
		return 0, "", "", nil, err
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().GetEvent().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			pid = ev.Start.Pid
		case *pb.ProcessEvent_Data:
			stdout += string(ev.Data.GetStdout())
			stderr += string(ev.Data.GetStderr())
		case *pb.ProcessEvent_End:
			end = ev.End
		}
	}
	return pid, stdout, stderr, end, st.Err()
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

func TestEnvdProcessStart(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	id := e.create(nil).SandboxID
	for _, json := range []bool{true, false} {
		// E2B's SDK: /bin/bash -l -c LINE (the fake has no /bin/bash either: it runs the line's built-ins).
		pid, out, errOut, end, err := e.envdRun(id, json, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi; echo oops >&2; exit 3"}}})
		if err != nil || pid == 0 || out != "hi\n" || errOut != "oops\n" || end == nil || end.ExitCode != 3 || !end.Exited || end.Status != "exit status 3" {
			t.Errorf("json=%v: pid %d out %q err %q end %v: %v", json, pid, out, errOut, end, err)
		}
	}
	// Without /bin/bash in the sandbox, E2B's `/bin/bash -l -c LINE` runs with /bin/sh; with it, as asked.
	for _, c := range []struct {
		files []string
		want  string
	}{{nil, "/bin/bash"}, {[]string{"/bin/sh"}, "/bin/sh"}, {[]string{"/bin/sh", "/bin/bash"}, "/bin/bash"}} {
		for _, f := range c.files {
			e.f.WriteFile(context.Background(), id, f, []byte("#!"), 0o755, false)
		}
		if _, out, _, _, err := e.envdRun(id, true, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo x"}}}); err != nil || out != "x\n" {
			t.Errorf("%v: %q %v", c.files, out, err)
		}
		e.f.mu.Lock()
		got := e.f.execs[len(e.f.execs)-1]
		e.f.mu.Unlock()
		if got != c.want {
			t.Errorf("with %v: ran %s, want %s", c.files, got, c.want)
		}
	}
	// envs and cwd reach the exec.
	_, out, _, _, err := e.envdRun(id, true, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo", Args: []string{"a"}, Envs: map[string]string{"K": "v"}}})
	if err != nil || out != "a K=v\n" {
		t.Errorf("envs: %q %v", out, err)
	}
	// Bad input: named field, the right code.
	for _, c := range []struct {
		msg  *pb.StartRequest
		code connect.Code
		want string
	}{
		{&pb.StartRequest{}, connect.CodeInvalidArgument, `"process.cmd"`},
		{&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo", Envs: map[string]string{"A=B": "x"}}}, connect.CodeInvalidArgument, `"envs"`},
		{&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo"}, Pty: &pb.PTY{}}, connect.CodeUnimplemented, `"pty"`},
		{&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "nonexistent"}}, connect.CodeFailedPrecondition, "no such file"},
	} {
		_, _, _, _, err := e.envdRun(id, true, c.msg)
		if codeOf(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v (code %v), want %v naming %s", c.msg, err, codeOf(err), c.code, c.want)
		}
	}
	// A paused sandbox refuses (failed_precondition), an unknown one is not_found.
	e.want("POST", "/sandboxes/"+id+"/pause", nil, 204, nil)
	if _, _, _, _, err := e.envdRun(id, true, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo"}}); codeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("paused: %v", err)
	}
}

func TestEnvdAuthAndRouting(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	id := e.create(nil).SandboxID
	other := e.create(nil).SandboxID
	var sb Sandbox
	e.want("POST", "/sandboxes/"+id+"/connect", nil, 200, &sb)
	if sb.EnvdAccessToken == "" || sb.EnvdAccessToken != e.s.envdToken(id) || sb.EnvdVersion != EnvdVersion {
		t.Errorf("connect answer: token %q version %q", sb.EnvdAccessToken, sb.EnvdVersion)
	}
	stat := envdClient[fspb.StatRequest, fspb.StatResponse](e, "/filesystem.Filesystem/Stat", true)
	call := func(h http.Header) error {
		_, err := stat.CallUnary(context.Background(), withHeaders(&fspb.StatRequest{Path: "/"}, h))
		return err
	}
	if err := call(e.envdHeaders(id)); err != nil {
		t.Errorf("with the token: %v", err)
	}
	h := e.envdHeaders(id)
	h.Set(EnvdTokenHeader, e.s.envdToken(other))
	if err := call(h); codeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), EnvdTokenHeader) {
		t.Errorf("another sandbox's token: %v", err)
	}
	h.Del(EnvdTokenHeader)
	if err := call(h); codeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no credentials: %v", err)
	}
	h.Set("X-API-Key", envdKeyForTests)
	if err := call(h); err != nil {
		t.Errorf("the API key: %v", err)
	}
	if err := call(http.Header{EnvdTokenHeader: {sb.EnvdAccessToken}}); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), EnvdSandboxHeader) {
		t.Errorf("no sandbox named: %v", err)
	}
	unknown := e.envdHeaders("nosuchsandbox")
	if err := call(unknown); codeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}
	// E2B_DOMAIN: the sandbox named by the host 49983-<id>.<domain> (a TLS proxy in front of cube-api).
	req, _ := http.NewRequest("POST", e.srv.URL+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`))
	req.Host = "49983-" + id + ".sandbox.example"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(EnvdTokenHeader, sb.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("by host: %v %v", resp, err)
	}
	resp.Body.Close()
	// Basic credentials name the user: a name the sandbox cannot resolve is refused naming "user".
	h = e.envdHeaders(id)
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:")))
	_, _, _, _, err = func() (uint32, string, string, *pb.ProcessEvent_EndEvent, error) {
		c := envdClient[pb.StartRequest, pb.StartResponse](e, "/process.Process/Start", true)
		st, err := c.CallServerStream(context.Background(), withHeaders(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "echo"}}, h))
		if err != nil {
			return 0, "", "", nil, err
		}
		for st.Receive() {
		}
		return 0, "", "", nil, st.Err()
	}()
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("user alice: %v", err)
	}
	// Without API keys no credentials are needed, and no token is given.
	open := newEnv(t, nil)
	sb2 := open.create(nil)
	if sb2.EnvdAccessToken != "" {
		t.Errorf("token without keys: %q", sb2.EnvdAccessToken)
	}
	if _, err := envdClient[fspb.StatRequest, fspb.StatResponse](open, "/filesystem.Filesystem/Stat", true).CallUnary(context.Background(),
		withHeaders(&fspb.StatRequest{Path: "/"}, http.Header{EnvdSandboxHeader: {sb2.SandboxID}})); err != nil {
		t.Errorf("no keys: %v", err)
	}
}

// TestEnvdWireFraming checks the bytes on the wire as E2B's JS SDK sends and reads them: unary JSON, and a
// server stream of enveloped JSON messages ending with an end-of-stream envelope.
func TestEnvdWireFraming(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	id := e.create(nil).SandboxID
	post := func(path, ctype string, body []byte) (*http.Response, []byte) {
		req, _ := http.NewRequest("POST", e.srv.URL+path, bytes.NewReader(body))
		req.Header = e.envdHeaders(id)
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Connect-Protocol-Version", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, b := post("/filesystem.Filesystem/MakeDir", "application/json", []byte(`{"path":"/w/d"}`))
	var made struct {
		Entry struct{ Name, Type, Path, Permissions string }
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &made) != nil || made.Entry.Type != "FILE_TYPE_DIRECTORY" || made.Entry.Path != "/w/d" || made.Entry.Permissions != "drwxr-xr-x" {
		t.Errorf("unary JSON: %d %s", resp.StatusCode, b)
	}
	resp, b = post("/filesystem.Filesystem/MakeDir", "application/json", []byte(`{"path":"/w/d"}`))
	if resp.StatusCode != 409 || !strings.Contains(string(b), `"code":"already_exists"`) {
		t.Errorf("unary error: %d %s", resp.StatusCode, b)
	}
	resp, b = post("/filesystem.Filesystem/Stat", "application/json", []byte(`{"path":"relative"}`))
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_argument"`) || !strings.Contains(string(b), `\"path\"`) {
		t.Errorf("bad path: %d %s", resp.StatusCode, b)
	}
	resp, b = post("/filesystem.Filesystem/Stat", "application/json", []byte(`{"path":`))
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"code":"invalid_argument"`) {
		t.Errorf("malformed JSON: %d %s", resp.StatusCode, b)
	}
	// A server stream: envelopes (flags, big-endian length, JSON), the last one flagged end-of-stream (2).
	msg := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}`)
	env := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	resp, b = post("/process.Process/Start", "application/connect+json", append(env, msg...))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("stream: %d %v %q", resp.StatusCode, resp.Header, b)
	}
	var frames []string
	var last byte
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		last = b[0]
		frames = append(frames, string(b[5:5+n]))
		b = b[5+n:]
	}
	if len(frames) != 4 || !strings.Contains(frames[0], `"start":{"pid":`) || frames[1] != `{"event":{"data":{"stdout":"aGkK"}}}` ||
		!strings.Contains(frames[2], `"end":{`) || !strings.Contains(frames[2], `"exited":true`) || last != 2 || frames[3] != `{}` {
		t.Errorf("stream frames %q (last flags %d)", frames, last)
	}
	// An error in a stream is in the end-of-stream envelope (HTTP 200).
	resp, b = post("/process.Process/Start", "application/connect+json", append(binary.BigEndian.AppendUint32([]byte{0}, 2), "{}"...))
	if resp.StatusCode != 200 || b[0] != 2 || !strings.Contains(string(b), `"code":"invalid_argument"`) {
		t.Errorf("stream error: %d %q", resp.StatusCode, b)
	}
}

func TestEnvdProcessControl(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	id := e.create(nil).SandboxID
	h := e.envdHeaders(id)
	// A background process with stdin, tagged: listed, fed, closed; a sleeping one signalled.
	start := envdClient[pb.StartRequest, pb.StartResponse](e, "/process.Process/Start", true)
	tag, yes := "cat-1", true
	st, err := start.CallServerStream(context.Background(), withHeaders(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}, Tag: &tag, Stdin: &yes}, h))
	if err != nil || !st.Receive() {
		t.Fatalf("start: %v %v", err, st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	list, err := envdClient[pb.ListRequest, pb.ListResponse](e, "/process.Process/List", true).CallUnary(context.Background(), withHeaders(&pb.ListRequest{}, h))
	if err != nil || len(list.Msg.Processes) != 1 || list.Msg.Processes[0].Pid != pid || list.Msg.Processes[0].GetTag() != tag || list.Msg.Processes[0].Config.Cmd != "cat" {
		t.Fatalf("list: %v %v", list, err)
	}
	in := envdClient[pb.SendInputRequest, pb.SendInputResponse](e, "/process.Process/SendInput", true)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
	if _, err := in.CallUnary(context.Background(), withHeaders(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("fed\n")}}}, h)); err != nil {
		t.Fatal(err)
	}
	if _, err := in.CallUnary(context.Background(), withHeaders(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}}, h)); codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("pty input: %v", err)
	}
	if _, err := envdClient[pb.CloseStdinRequest, pb.CloseStdinResponse](e, "/process.Process/CloseStdin", true).CallUnary(context.Background(), withHeaders(&pb.CloseStdinRequest{Process: sel}, h)); err != nil {
		t.Fatal(err)
	}
	var out string
	var end *pb.ProcessEvent_EndEvent
	for st.Receive() {
		out += string(st.Msg().GetEvent().GetData().GetStdout())
		if e := st.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if out != "fed\n" || end == nil || end.ExitCode != 0 {
		t.Errorf("cat: %q %v %v", out, end, st.Err())
	}
	st.Close()
}

// A sleeping process, disconnected, reconnected by pid with Connect, killed with SIGTERM.
func TestEnvdProcessSignal(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	h := e.envdHeaders(e.create(nil).SandboxID)
	start := envdClient[pb.StartRequest, pb.StartResponse](e, "/process.Process/Start", true)
	st, err := start.CallServerStream(context.Background(), withHeaders(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sleep"}}, h))
	if err != nil || !st.Receive() {
		t.Fatalf("start sleep: %v", err)
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	st.Close()
	bypid := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	conn := envdClient[pb.ConnectRequest, pb.ConnectResponse](e, "/process.Process/Connect", true)
	var cs *connect.ServerStreamForClient[pb.ConnectResponse]
	for i := 0; ; i++ { // the first stream's end is seen by the server a little later
		cs, err = conn.CallServerStream(context.Background(), withHeaders(&pb.ConnectRequest{Process: bypid}, h))
		if err == nil && cs.Receive() {
			break
		}
		if i > 200 || codeOf(cs.Err()) != connect.CodeFailedPrecondition {
			t.Fatalf("connect: %v %v", err, cs.Err())
		}
	}
	sig := envdClient[pb.SendSignalRequest, pb.SendSignalResponse](e, "/process.Process/SendSignal", true)
	if _, err := sig.CallUnary(context.Background(), withHeaders(&pb.SendSignalRequest{Process: bypid}, h)); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `"signal"`) {
		t.Errorf("no signal: %v", err)
	}
	if _, err := sig.CallUnary(context.Background(), withHeaders(&pb.SendSignalRequest{Process: bypid, Signal: pb.Signal_SIGNAL_SIGTERM}, h)); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for cs.Receive() {
		if e := cs.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.ExitCode != 143 {
		t.Errorf("SIGTERM: %v %v", end, cs.Err())
	}
	gone := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 99999}}
	if _, err := sig.CallUnary(context.Background(), withHeaders(&pb.SendSignalRequest{Process: gone, Signal: pb.Signal_SIGNAL_SIGKILL}, h)); codeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown pid: %v", err)
	}
	if _, err := envdClient[pb.UpdateRequest, pb.UpdateResponse](e, "/process.Process/Update", true).CallUnary(context.Background(), withHeaders(&pb.UpdateRequest{Process: bypid}, h)); codeOf(err) != connect.CodeUnimplemented {
		t.Errorf("update: %v", err)
	}
}

func TestEnvdFileRoutes(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFileBytes = 1024 }, envdKeyForTests)
	id := e.create(nil).SandboxID
	h := e.envdHeaders(id)
	send := func(method, path, ctype string, body []byte, extra ...string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
		req.Header = h.Clone()
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		for i := 0; i+1 < len(extra); i += 2 {
			req.Header.Set(extra[i], extra[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	// Multipart, as E2B's SDK writes: the part's filename is the full path.
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormFile("file", "/home/user/a b.txt")
	fw.Write([]byte("one"))
	fw, _ = mw.CreateFormFile("file", "/home/user/sub/two.txt")
	fw.Write([]byte("two"))
	mw.Close()
	resp, b := send("POST", "/files", mw.FormDataContentType(), mp.Bytes())
	var wi []WriteInfo
	if resp.StatusCode != 200 || json.Unmarshal(b, &wi) != nil || len(wi) != 2 || wi[0] != (WriteInfo{"a b.txt", "file", "/home/user/a b.txt"}) {
		t.Fatalf("multipart write: %d %s", resp.StatusCode, b)
	}
	resp, b = send("GET", "/files?path=%2Fhome%2Fuser%2Fsub%2Ftwo.txt&username=root", "", nil)
	if resp.StatusCode != 200 || string(b) != "two" {
		t.Errorf("read: %d %q", resp.StatusCode, b)
	}
	// Octet stream, gzip-encoded (envd 0.5.7).
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()
	resp, b = send("POST", "/files?path=/z.txt", "application/octet-stream", gz.Bytes(), "Content-Encoding", "gzip")
	if resp.StatusCode != 200 {
		t.Errorf("gzip write: %d %s", resp.StatusCode, b)
	}
	if _, b = send("GET", "/files?path=/z.txt", "", nil); string(b) != "zipped" {
		t.Errorf("gzip read: %q", b)
	}
	// Errors: {code, message} with the status E2B's SDK maps (404, 400 naming the parameter, 413).
	for _, c := range []struct {
		method, path, ctype string
		body                []byte
		code                int
		want                string
	}{
		{"GET", "/files?path=/missing", "", nil, 404, "missing"},
		{"GET", "/files?path=rel", "", nil, 400, `"path"`},
		{"POST", "/files", "application/octet-stream", []byte("x"), 400, `"path"`},
		{"POST", "/files?path=/big", "application/octet-stream", bytes.Repeat([]byte("x"), 1025), 413, "max_file_bytes"},
		{"POST", "/files", "multipart/form-data", []byte("x"), 400, "boundary"},
		{"POST", "/files?path=/g", "application/octet-stream", []byte("not gzip"), 400, "gzip"},
	} {
		var extra []string
		if c.path == "/files?path=/g" {
			extra = []string{"Content-Encoding", "gzip"}
		}
		resp, b := send(c.method, c.path, c.ctype, c.body, extra...)
		var er Error
		if resp.StatusCode != c.code || json.Unmarshal(b, &er) != nil || er.Code != c.code || !strings.Contains(er.Message, c.want) {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.method, c.path, resp.StatusCode, b, c.code, c.want)
		}
	}
}

// filesystem.Filesystem: list (depth), stat, remove; the unserved ones say unimplemented.
func TestEnvdFilesystem(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	id := e.create(nil).SandboxID
	h := e.envdHeaders(id)
	for _, p := range []string{"/home/user/a b.txt", "/home/user/sub/two.txt", "/z.txt"} {
		e.f.WriteFile(context.Background(), id, p, []byte("x"), 0, false)
	}
	ls := envdClient[fspb.ListDirRequest, fspb.ListDirResponse](e, "/filesystem.Filesystem/ListDir", true)
	res, err := ls.CallUnary(context.Background(), withHeaders(&fspb.ListDirRequest{Path: "/home/user", Depth: 2}, h))
	var names []string
	if err == nil {
		for _, en := range res.Msg.Entries {
			names = append(names, en.Path)
		}
	}
	if strings.Join(names, ",") != "/home/user/a b.txt,/home/user/sub,/home/user/sub/two.txt" {
		t.Errorf("list depth 2: %v %v", names, err)
	}
	if _, err := ls.CallUnary(context.Background(), withHeaders(&fspb.ListDirRequest{Path: "/z.txt"}, h)); codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("list a file: %v", err)
	}
	rm := envdClient[fspb.RemoveRequest, fspb.RemoveResponse](e, "/filesystem.Filesystem/Remove", false)
	if _, err := rm.CallUnary(context.Background(), withHeaders(&fspb.RemoveRequest{Path: "/home/user/sub"}, h)); err != nil {
		t.Errorf("remove a directory: %v", err)
	}
	stat := envdClient[fspb.StatRequest, fspb.StatResponse](e, "/filesystem.Filesystem/Stat", false)
	if _, err := stat.CallUnary(context.Background(), withHeaders(&fspb.StatRequest{Path: "/home/user/sub"}, h)); codeOf(err) != connect.CodeNotFound {
		t.Errorf("stat removed: %v", err)
	}
	mv := envdClient[fspb.MoveRequest, fspb.MoveResponse](e, "/filesystem.Filesystem/Move", true)
	if _, err := mv.CallUnary(context.Background(), withHeaders(&fspb.MoveRequest{Source: "/z.txt", Destination: "/y"}, h)); codeOf(err) != connect.CodeUnimplemented {
		t.Errorf("move: %v", err)
	}
	// envd's health (for E2B's isRunning) through the sandbox host name.
	req, _ := http.NewRequest("GET", e.srv.URL+"/health", nil)
	req.Host = "49983-" + id + ".example"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 204 {
		t.Errorf("envd health: %v %v", resp, err)
	}
}

// E2B's SDK's REST bodies: /v2 paths, pause and connect with "memory".
func TestE2BRestCompat(t *testing.T) {
	e := newEnv(t, nil, envdKeyForTests)
	var sb Sandbox
	e.want("POST", "/v2/sandboxes", map[string]any{"templateID": "docker.io/library/busybox:latest", "timeout": 60}, 201, &sb)
	if sb.EnvdVersion != EnvdVersion || sb.EnvdAccessToken != e.s.envdToken(sb.SandboxID) {
		t.Errorf("create: %+v", sb)
	}
	e.wantError("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"memory": false}, 501, `"memory"`)
	e.want("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"memory": true}, 204, nil)
	e.wantError("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"memory": false}, 501, `"memory"`)
	e.want("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 30}, 201, &sb)
	if sb.State != "running" || sb.EnvdAccessToken == "" {
		t.Errorf("connect: %+v", sb)
	}
}
