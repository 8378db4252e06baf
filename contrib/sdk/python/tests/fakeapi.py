"""A fake cube-api for the SDK's tests (stdlib http.server): the routes,
status codes, {code, message} errors, X-Next-Token pages and NDJSON command
streams of docs/api.md, over in-memory state."""

import json
import queue
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = "py-test-key-0123456789"


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.sandboxes = {}  # id -> dict
        self.snapshots = []  # dicts, oldest first
        self.commands = {}  # (sandbox, pid) -> dict(kill=Queue, stdin=Queue, info=dict)
        self.files = {}  # (sandbox, path) -> bytes, or None for a directory
        self.n = 0
        self.requests = []  # (method, path, body, headers)
        self.templates = []  # dicts, oldest first
        self.fail_at = set()  # the nth sandboxes made from snapshots (from 1) that fail
        self.made = 0
        self.fork_delay = 0  # seconds a fork takes before it answers (a client's request_timeout)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    state = None

    def log_message(self, *a):
        pass

    def reply(self, code, body=None, headers=None):
        raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Request-Id", "req-%d" % len(self.state.requests))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left (its request_timeout)

    def error(self, code, message):
        self.reply(code, {"code": code, "message": message})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.headers.get("Content-Type") == "application/octet-stream":
            return raw
        return json.loads(raw) if raw.strip() else None

    def handle_any(self, method):
        st = self.state
        u = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(u.query)
        body = self.body()
        st.requests.append((method, u.path, body, dict(self.headers)))
        auth = self.headers.get("Authorization", "")
        if u.path != "/health" and auth != "Bearer " + KEY and self.headers.get("X-API-Key") != KEY:
            return self.error(401, "missing API key" if not auth else "wrong API key")
        for pattern, fn in ROUTES:
            if pattern[0] != method:
                continue
            m = re.fullmatch(pattern[1], u.path)
            if m:
                with_lock = fn is not run_command
                if with_lock:
                    with st.lock:
                        return fn(self, st, q, body, *m.groups())
                return fn(self, st, q, body, *m.groups())
        self.error(404, "no route %s %s" % (method, u.path))

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def do_PUT(self):
        self.handle_any("PUT")

    def raw(self, code, data, headers=None):
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def sandbox_or_404(h, st, sid):
    sb = st.sandboxes.get(sid)
    if sb is None:
        h.error(404, "no sandbox %s" % sid)
    return sb


def create(h, st, q, body):
    if not isinstance(body, dict) or not body.get("templateID"):
        return h.error(400, 'field "templateID" is required')
    ref = body["templateID"]
    if ref != "busybox" and find_snapshot(st, ref) is None and find_template(st, ref) is None:
        return h.error(404, 'field "templateID": unknown template "%s": no such image or snapshot' % ref)
    if not isinstance(body.get("timeout", 0), int):
        return h.error(400, 'field "timeout": want a number')
    h.reply(201, new_sandbox(st, body))


def new_sandbox(st, body):
    st.n += 1
    sid = "sb%018d" % st.n
    sb = {"sandboxID": sid, "templateID": body["templateID"], "clientID": "cube", "state": "running",
          "startedAt": "2026-12-01T12:00:%02dZ" % st.n, "endAt": "", "timeout": body.get("timeout") or 300,
          "autoPause": body.get("autoPause", False), "metadata": body.get("metadata") or {},
          "envs": body.get("envVars") or {}}
    st.sandboxes[sid] = sb
    return sb


def find_template(st, tid):
    for t in st.templates:
        if t["templateID"] == tid:
            return t
    return None


def fork(h, st, q, body, sid):
    src = sandbox_or_404(h, st, sid)
    if src is None:
        return
    count = (body or {}).get("count")
    if not isinstance(count, int) or not 1 <= count <= 100:
        return h.error(400, 'field "count": %r is out of range 1..100' % (count,))
    all_or_nothing = bool((body or {}).get("allOrNothing"))
    if st.fork_delay:
        time.sleep(st.fork_delay)
    # The temporary snapshot, as cube-api's: gone when the answer is sent.
    st.n += 1
    tmp = {"snapshotID": "%024x" % st.n, "names": [], "sandboxID": sid, "kind": "full", "inUse": False}
    st.snapshots.append(tmp)
    items, failed = [], False
    for _ in range(count):
        if failed and all_or_nothing:
            items.append({"error": {"code": 409, "message": "not made: another clone failed first (all or nothing)"}})
            continue
        st.made += 1
        if st.made in st.fail_at:
            failed = True
            items.append({"error": {"code": 500, "message": "clone %d: out of memory" % st.made}})
            continue
        sb = new_sandbox(st, {"templateID": src["templateID"], "timeout": (body or {}).get("timeout"),
                              "metadata": src["metadata"]})
        items.append({"sandbox": sb})
    if failed and all_or_nothing:
        for i, it in enumerate(items):
            if "sandbox" in it:
                del st.sandboxes[it["sandbox"]["sandboxID"]]
                items[i] = {"error": {"code": 409, "message": "made, then deleted (all or nothing)"}}
    st.snapshots.remove(tmp)
    st.last_fork = items
    h.reply(200, items)


def not_yet(h, st, q, body):
    h.error(501, "not implemented yet")


def build_template(h, st, q, body):
    if not isinstance(body, dict) or not body.get("image"):
        return h.error(400, 'field "image" is required')
    if body["image"] != "busybox":
        return h.error(404, 'field "image": unknown image "%s"' % body["image"])
    if body.get("readyCmd") == ["false"]:
        return h.error(504, 'template: not ready within 1s: readyCmd ["false"]: exit code 1')
    st.n += 1
    tid = body.get("templateID") or "tpl-%06d" % st.n
    if find_template(st, tid) or find_snapshot(st, tid):
        return h.error(409, 'field "templateID": "%s" names a snapshot or template already' % tid)
    t = {"templateID": tid, "snapshotID": "%024x" % st.n, "image": body["image"], "sizeBytes": 4096,
         "createdAt": "2026-12-01T12:00:00Z", "inUse": False, "buildMs": 12.5, "request": body}
    st.templates.append(t)
    h.reply(201, t)


def list_templates(h, st, q, body):
    h.reply(200, st.templates)


def get_template(h, st, q, body, tid):
    t = find_template(st, tid)
    h.reply(200, t) if t else h.error(404, 'no template "%s"' % tid)


def delete_template(h, st, q, body, tid):
    t = find_template(st, tid)
    if t is None:
        return h.error(404, 'no template "%s"' % tid)
    if t["inUse"]:
        return h.error(409, "template %s is in use" % tid)
    st.templates.remove(t)
    h.reply(204)


def page(h, items, q):
    limit = int(q.get("limit", ["100"])[0])
    start = int(q.get("nextToken", ["0"])[0])
    chunk = items[start:start + limit]
    headers = {"X-Next-Token": str(start + limit)} if start + limit < len(items) else {}
    h.reply(200, chunk, headers)


def list_sandboxes(h, st, q, body):
    items = list(st.sandboxes.values())
    if "state" in q:
        states = q["state"][0].split(",")
        items = [s for s in items if s["state"] in states]
    if "metadata" in q:
        want = dict(urllib.parse.parse_qsl(q["metadata"][0]))
        items = [s for s in items if all(s["metadata"].get(k) == v for k, v in want.items())]
    page(h, items, q)


def get_sandbox(h, st, q, body, sid):
    sb = sandbox_or_404(h, st, sid)
    if sb:
        h.reply(200, sb)


def delete_sandbox(h, st, q, body, sid):
    if sandbox_or_404(h, st, sid):
        del st.sandboxes[sid]
        h.reply(204)


def pause(h, st, q, body, sid):
    sb = sandbox_or_404(h, st, sid)
    if sb is None:
        return
    if sb["state"] != "running":
        return h.error(409, "sandbox %s is %s" % (sid, sb["state"]))
    sb["state"] = "paused"
    h.reply(204)


def resume(h, st, q, body, sid, connect=False):
    sb = sandbox_or_404(h, st, sid)
    if sb is None:
        return
    if body and "timeout" in body:
        sb["timeout"] = body["timeout"]
    if sb["state"] == "running" and connect:
        return h.reply(200, sb)
    if sb["state"] != "paused":
        return h.error(409, "sandbox %s is %s, not paused" % (sid, sb["state"]))
    sb["state"] = "running"
    h.reply(201, sb)


def connect(h, st, q, body, sid):
    resume(h, st, q, body, sid, connect=True)


def set_timeout(h, st, q, body, sid):
    sb = sandbox_or_404(h, st, sid)
    if sb:
        sb["timeout"] = body["timeout"]
        h.reply(204)


def create_snapshot(h, st, q, body, sid):
    if not sandbox_or_404(h, st, sid):
        return
    name = (body or {}).get("name")
    if name and any(name in s["names"] for s in st.snapshots):
        return h.error(409, 'name "%s" is taken' % name)
    st.n += 1
    s = {"snapshotID": "%024x" % st.n, "names": [name] if name else [], "sandboxID": sid, "kind": "full",
         "sizeBytes": 4096, "createdAt": "2026-12-01T12:00:00Z", "inUse": False, "frozenMs": 1.5, "totalMs": 7}
    st.snapshots.append(s)
    h.reply(201, s)


def find_snapshot(st, ref):
    for s in st.snapshots:
        if s["snapshotID"] == ref or ref in s["names"]:
            return s
    return None


def list_snapshots(h, st, q, body):
    items = st.snapshots
    if "sandboxID" in q:
        items = [s for s in items if s["sandboxID"] == q["sandboxID"][0]]
    page(h, items, q)


def get_snapshot(h, st, q, body, ref):
    s = find_snapshot(st, ref)
    h.reply(200, s) if s else h.error(404, "no snapshot %s" % ref)


def delete_snapshot(h, st, q, body, ref):
    s = find_snapshot(st, ref)
    if s is None:
        return h.error(404, "no snapshot %s" % ref)
    if s["inUse"]:
        return h.error(409, "snapshot %s is in use" % ref)
    st.snapshots.remove(s)
    h.reply(204)


def run_command(h, st, q, body, sid):
    with st.lock:
        sb = sandbox_or_404(h, st, sid)
        if sb is None:
            return
        st.n += 1
        pid = st.n
        c = {"kill": queue.Queue(), "stdin": queue.Queue(), "info": {"pid": pid, "cmd": body["cmd"], "args": body.get("args", [])}}
        st.commands[(sid, pid)] = c
    line = " ".join([body["cmd"]] + body.get("args", []))
    line = line[len("/bin/sh -c "):] if line.startswith("/bin/sh -c ") else line
    h.send_response(200)
    h.send_header("Content-Type", "application/x-ndjson")
    h.end_headers()

    def ev(**e):
        h.wfile.write((json.dumps(e) + "\n").encode())
        h.wfile.flush()
    code = 0
    try:
        ev(type="start", pid=pid)
        if line.startswith("echo "):
            env = " ".join("%s=%s" % kv for kv in sorted((body.get("envs") or {}).items()))
            ev(type="stdout", data=line[5:] + "\n")
            if env:
                ev(type="stdout", data=env + "\n")
        elif line.startswith("exit "):
            ev(type="stderr", data="bye\n")
            code = int(line[5:])
        elif line == "cat":
            while True:
                d = c["stdin"].get(timeout=10)
                if d is None:
                    break
                ev(type="stdout", data=d)
        elif line == "sleep":
            code = 128 + c["kill"].get(timeout=10)
        elif line == "pwd":
            ev(type="stdout", data=(body.get("cwd") or "/") + " " + (body.get("user") or "root") + "\n")
        ev(type="exit", exitCode=code)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        with st.lock:
            st.commands.pop((sid, pid), None)


def list_commands(h, st, q, body, sid):
    if sandbox_or_404(h, st, sid):
        h.reply(200, [c["info"] for (s, _), c in sorted(st.commands.items()) if s == sid])


def command_or_404(h, st, sid, pid):
    c = st.commands.get((sid, int(pid)))
    if c is None:
        h.error(404, "no running command with pid %s" % pid)
    return c


def stdin(h, st, q, body, sid, pid):
    c = command_or_404(h, st, sid, pid)
    if c:
        if body.get("data"):
            c["stdin"].put(body["data"])
        if body.get("eof"):
            c["stdin"].put(None)
        h.reply(204)


def kill(h, st, q, body, sid, pid):
    c = command_or_404(h, st, sid, pid)
    if c:
        c["kill"].put({"SIGTERM": 15}.get((body or {}).get("signal"), 9))
        h.reply(204)


def rollback(h, st, q, body, sid):
    if not sandbox_or_404(h, st, sid):
        return
    ref = (body or {}).get("snapshotID")
    if not isinstance(ref, str) or not ref:
        return h.error(400, 'field "snapshotID" is required')
    s = find_snapshot(st, ref)
    if s is None:
        return h.error(404, 'field "snapshotID": no snapshot "%s"' % ref)
    if st.sandboxes[sid].get("busy"):
        return h.error(409, "sandbox %s is busy: a snapshot runs on it" % sid)
    h.reply(200, {"sandboxID": sid, "snapshotID": s["snapshotID"], "memory": "rewrite-dirty", "frozenMs": 2,
                  "totalMs": 9, "processes": [{"pid": 7, "action": "unknown", "status": "running", "command": True}],
                  "warnings": []})


def fpath(h, q):
    p = q.get("path", [""])[0]
    if not p.startswith("/"):
        h.error(400, 'query parameter "path": "%s" is not absolute' % p)
        return None
    return p.rstrip("/") or "/"


def entry(sid, st, p):
    d = st.files[(sid, p)]
    return {"name": p.rsplit("/", 1)[1], "path": p, "type": "dir" if d is None else "file",
            "size": 0 if d is None else len(d), "mode": 0o644, "permissions": "-rw-r--r--",
            "modifiedTime": "2026-12-01T12:00:00Z"}


def parents(st, sid, p):
    parts = p.split("/")[1:-1]
    for i in range(1, len(parts) + 1):
        st.files.setdefault((sid, "/" + "/".join(parts[:i])), None)


def read_file(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        d = st.files.get((sid, p))
        if d is None:
            return h.error(404 if (sid, p) not in st.files else 400, "read %s" % p)
        off, n = int(q.get("offset", ["0"])[0]), q.get("length", [None])[0]
        h.raw(200, d[off:off + int(n)] if n else d[off:], {"X-File-Size": str(len(d))})


def write_file(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        parents(st, sid, p)
        old = st.files.get((sid, p)) or b""
        st.files[(sid, p)] = (old if q.get("append") == ["true"] else b"") + (body or b"")
        h.reply(200, entry(sid, st, p))


def stat_file(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        h.reply(200, entry(sid, st, p)) if (sid, p) in st.files else h.error(404, "stat %s" % p)


def list_dir(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        names = sorted(k[1] for k in st.files if k[0] == sid and k[1].rsplit("/", 1)[0] == p)
        after = q.get("nextToken", [""])[0]
        names = [n for n in names if n.rsplit("/", 1)[1] > after]
        page = names[:2]  # small pages: the SDK must follow X-Next-Token
        headers = {"X-Next-Token": page[-1].rsplit("/", 1)[1]} if len(names) > 2 else {}
        h.reply(200, [entry(sid, st, n) for n in page], headers)


def remove_file(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        if (sid, p) not in st.files:
            return h.error(404, "remove %s" % p)
        inside = [k for k in st.files if k[0] == sid and k[1].startswith(p + "/")]
        if inside and q.get("recursive") != ["true"]:
            return h.error(409, "remove %s: the directory is not empty" % p)
        for k in inside + [(sid, p)]:
            del st.files[k]
        h.reply(204)


def make_dir(h, st, q, body, sid):
    p = sandbox_or_404(h, st, sid) and fpath(h, q)
    if p:
        created = (sid, p) not in st.files
        parents(st, sid, p + "/x")
        h.reply(201 if created else 200, {"path": p, "created": created})


def set_network(h, st, q, body, sid):
    sb = sandbox_or_404(h, st, sid)
    if sb is None:
        return
    for f in ("allowOut", "denyOut"):
        for c in body.get(f) or []:
            if "/" not in c and c.count(".") != 3:
                return h.error(400, 'field "network.%s": "%s" is neither a CIDR nor an address' % (f, c))
    sb["network"] = body
    h.reply(200, {"allow_internet_access": body.get("allow_internet_access", True), "allowOut": body.get("allowOut") or [],
                  "denyOut": body.get("denyOut") or [], "dropped": {}})


ID = "([^/]+)"
ROUTES = [
    (("PUT", "/sandboxes/%s/network" % ID), set_network),
    (("POST", "/sandboxes"), create),
    (("GET", "/v2/sandboxes"), list_sandboxes),
    (("GET", "/sandboxes/" + ID), get_sandbox),
    (("DELETE", "/sandboxes/" + ID), delete_sandbox),
    (("POST", "/sandboxes/%s/pause" % ID), pause),
    (("POST", "/sandboxes/%s/resume" % ID), resume),
    (("POST", "/sandboxes/%s/connect" % ID), connect),
    (("POST", "/sandboxes/%s/timeout" % ID), set_timeout),
    (("POST", "/sandboxes/%s/snapshots" % ID), create_snapshot),
    (("POST", "/sandboxes/%s/rollback" % ID), rollback),
    (("POST", "/sandboxes/%s/fork" % ID), fork),
    (("POST", "/templates"), build_template),
    (("POST", "/fake/not-implemented"), not_yet),  # fake-only: the 501 mapping
    (("GET", "/templates"), list_templates),
    (("GET", "/templates/" + ID), get_template),
    (("DELETE", "/templates/" + ID), delete_template),
    (("GET", "/snapshots"), list_snapshots),
    (("GET", "/snapshots/" + ID), get_snapshot),
    (("DELETE", "/snapshots/" + ID), delete_snapshot),
    (("POST", "/sandboxes/%s/commands" % ID), run_command),
    (("GET", "/sandboxes/%s/commands" % ID), list_commands),
    (("POST", "/sandboxes/%s/commands/(\\d+)/stdin" % ID), stdin),
    (("POST", "/sandboxes/%s/commands/(\\d+)/kill" % ID), kill),
    (("GET", "/sandboxes/%s/files" % ID), read_file),
    (("PUT", "/sandboxes/%s/files" % ID), write_file),
    (("DELETE", "/sandboxes/%s/files" % ID), remove_file),
    (("GET", "/sandboxes/%s/files/stat" % ID), stat_file),
    (("GET", "/sandboxes/%s/files/list" % ID), list_dir),
    (("POST", "/sandboxes/%s/files/dir" % ID), make_dir),
]


def start():
    """Starts a fake cube-api on 127.0.0.1; returns (server, state, url)."""
    st = State()
    handler = type("H", (Handler,), {"state": st})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return srv, st, "http://127.0.0.1:%d" % srv.server_address[1]
