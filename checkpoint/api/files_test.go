package api

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// fpath is a files route of sandbox id with query parameters kv.
func fpath(id, route string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return "/sandboxes/" + id + "/files" + route + "?" + q.Encode()
}

func TestFiles(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFileBytes = 5 << 20 })
	id := e.create(nil).SandboxID
	// A file of more than one chunk between cube-api and the guest.
	big := bytes.Repeat([]byte("0123456789abcdef"), (MaxFileChunk+MaxFileChunk/2)/16)
	big[7] = 0xff
	var ei EntryInfo
	e.want("PUT", fpath(id, "", "path", "/home/user/dir/big.bin", "mode", "0600"), string(big), 200, &ei)
	if ei.Name != "big.bin" || ei.Path != "/home/user/dir/big.bin" || ei.Type != "file" || ei.Size != int64(len(big)) || ei.Mode != 0o600 || ei.Permissions != "-rw-------" {
		t.Errorf("written: %+v", ei)
	}
	resp, b := e.do("GET", fpath(id, "", "path", "/home/user/dir/big.bin"), nil)
	if resp.StatusCode != 200 || !bytes.Equal(b, big) || resp.Header.Get(FileSizeHeader) != "3145728" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("read: %d, %d bytes, headers %v", resp.StatusCode, len(b), resp.Header)
	}
	resp, b = e.do("GET", fpath(id, "", "path", "/home/user/dir/big.bin", "offset", "16", "length", "4"), nil)
	if resp.StatusCode != 200 || string(b) != "0123" {
		t.Errorf("read a part: %d %q", resp.StatusCode, b)
	}
	// Append; a name with spaces and non-ASCII.
	odd := "/home/user/dir/ä b?#.txt"
	e.want("PUT", fpath(id, "", "path", odd), "hello ", 200, nil)
	e.want("PUT", fpath(id, "", "path", odd, "append", "true"), "world", 200, &ei)
	if _, b := e.do("GET", fpath(id, "", "path", odd), nil); string(b) != "hello world" || ei.Size != 11 {
		t.Errorf("appended: %q %+v", b, ei)
	}
	// An empty body makes an empty file.
	e.want("PUT", fpath(id, "", "path", "/empty"), nil, 200, &ei)
	if ei.Size != 0 || ei.Type != "file" {
		t.Errorf("empty: %+v", ei)
	}
	var md MakeDirInfo
	e.want("POST", fpath(id, "/dir", "path", "/home/user/dir/sub/deeper", "mode", "700"), nil, 201, &md)
	if !md.Created || md.Path != "/home/user/dir/sub/deeper" {
		t.Errorf("make dir: %+v", md)
	}
	e.want("POST", fpath(id, "/dir", "path", "/home/user/dir/sub/deeper"), nil, 200, &md)
	if md.Created {
		t.Errorf("existing dir: %+v", md)
	}
	e.want("GET", fpath(id, "/stat", "path", "/home/user/dir/sub"), nil, 200, &ei)
	if ei.Type != "dir" || ei.Permissions[0] != 'd' {
		t.Errorf("stat of a dir: %+v", ei)
	}
	var l []EntryInfo
	h := e.want("GET", fpath(id, "/list", "path", "/home/user/dir"), nil, 200, &l)
	if len(l) != 3 || l[0].Name != "big.bin" || l[1].Name != "sub" || l[1].Type != "dir" || l[2].Path != odd || h.Get(NextTokenHeader) != "" {
		t.Fatalf("list: %+v %v", l, h)
	}
	// Pages.
	h = e.want("GET", fpath(id, "/list", "path", "/home/user/dir", "limit", "2"), nil, 200, &l)
	next := h.Get(NextTokenHeader)
	if len(l) != 2 || next != "sub" {
		t.Fatalf("page 1: %+v %q", l, next)
	}
	h = e.want("GET", fpath(id, "/list", "path", "/home/user/dir", "limit", "2", "nextToken", next), nil, 200, &l)
	if len(l) != 1 || l[0].Path != odd || h.Get(NextTokenHeader) != "" {
		t.Errorf("page 2: %+v", l)
	}
	e.wantError("DELETE", fpath(id, "", "path", "/home/user/dir"), nil, 409, "not empty")
	e.want("DELETE", fpath(id, "", "path", odd), nil, 204, nil)
	e.want("DELETE", fpath(id, "", "path", "/home/user/dir", "recursive", "true"), nil, 204, nil)
	e.wantError("GET", fpath(id, "/stat", "path", "/home/user/dir"), nil, 404, "/home/user/dir")
	e.wantError("DELETE", fpath(id, "", "path", "/home/user/dir"), nil, 404)
	e.wantError("GET", fpath(id, "", "path", "/nope"), nil, 404, "/nope")
	e.wantError("GET", fpath(id, "", "path", "/home"), nil, 400, "directory")
	e.wantError("POST", fpath(id, "/dir", "path", "/empty"), nil, 409, "a file is there")
}

func TestFilesBadInput(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFileBytes = 1000 })
	id := e.create(nil).SandboxID
	for _, p := range []string{
		fpath(id, ""), fpath(id, "", "path", "rel/x"), fpath(id, "", "path", "/a\x00b"), fpath(id, "", "path", "/\xff"),
		fpath(id, "", "path", "/"+strings.Repeat("a", 5000)),
	} {
		e.wantError("GET", p, nil, 400, `query parameter "path"`)
		e.wantError("PUT", p, "x", 400, `query parameter "path"`)
		e.wantError("GET", strings.Replace(p, "/files?", "/files/list?", 1), nil, 400, `"path"`)
	}
	e.wantError("GET", fpath(id, "", "path", "/f", "offset", "-1"), nil, 400, `"offset"`)
	e.wantError("GET", fpath(id, "", "path", "/f", "length", "x"), nil, 400, `"length"`)
	e.wantError("GET", fpath(id, "", "path", "/f", "length", "1001"), nil, 400, `"length"`, "1000")
	e.wantError("PUT", fpath(id, "", "path", "/f", "mode", "0999"), "x", 400, `"mode"`)
	e.wantError("PUT", fpath(id, "", "path", "/f", "append", "maybe"), "x", 400, `"append"`)
	e.wantError("DELETE", fpath(id, "", "path", "/f", "recursive", "2x"), nil, 400, `"recursive"`)
	e.wantError("GET", fpath(id, "/list", "path", "/", "limit", "501"), nil, 400, `"limit"`)
	e.wantError("GET", fpath(id, "/list", "path", "/", "nextToken", "a/b"), nil, 400, `"nextToken"`)
	// A body beyond max_file_bytes: 413, the file untouched.
	e.want("PUT", fpath(id, "", "path", "/f"), "small", 200, nil)
	e.wantError("PUT", fpath(id, "", "path", "/f"), strings.Repeat("x", 1001), http.StatusRequestEntityTooLarge, "max_file_bytes", "append=true")
	if _, b := e.do("GET", fpath(id, "", "path", "/f"), nil); string(b) != "small" {
		t.Errorf("after a refused write: %q", b)
	}
	// A file beyond max_file_bytes is read in parts.
	e.want("PUT", fpath(id, "", "path", "/g"), strings.Repeat("y", 800), 200, nil)
	e.want("PUT", fpath(id, "", "path", "/g", "append", "true"), strings.Repeat("y", 800), 200, nil)
	e.wantError("GET", fpath(id, "", "path", "/g"), nil, 400, "max_file_bytes", "offset and length")
	if resp, b := e.do("GET", fpath(id, "", "path", "/g", "offset", "1000", "length", "1000"), nil); resp.StatusCode != 200 || len(b) != 600 {
		t.Errorf("the rest: %d, %d bytes", resp.StatusCode, len(b))
	}
	e.wantError("GET", fpath("nope", "", "path", "/f"), nil, 404, "nope")
	e.want("POST", "/sandboxes/"+id+"/pause", nil, 204, nil)
	e.wantError("GET", fpath(id, "/stat", "path", "/f"), nil, 409, "paused", "connect")
}
