#!/usr/bin/env python3
"""Issue 15's acceptance through the Python SDK, against a running cube-api.

Each step is printed with its time; the first check that does not hold ends
the run with exit 1 naming it (after removing what the run made). Steps:

  a. seed probe, 3 rounds: a template built through the SDK; a sandbox from
     it runs the worker (integration/snapshot/worker: a counter, a random
     identity, its pid and a digest, in memory only) as a background
     command; each round: hold → create_snapshot → release → it advances →
     SIGKILL → rollback → counter, identity, pid, digest equal exactly →
     it advances; then the sandbox is killed and Sandbox.create(template=
     snapshot) has the worker exactly as at the snapshot → it advances (the
     next round runs in that sandbox).
  b. clone(4, concurrency=2): each clone sees the source's file, writes its
     own that no other sandbox sees, and draws its own kernel randomness (the
     guest RNG reseeded); a clone with an invalid timeout is refused naming
     the field, a clone whose client deadline passes mid-fork raises
     CloneException and leaves no sandbox; fork(3): per-item results, each
     sandbox alive.
  c. a second snapshot, or a snapshot beside a rollback, on the same sandbox
     at once: exactly one is refused with 409; cube-api restarted, then
     containerd restarted: the sandbox keeps running and answers, snapshots
     restore (the restarts are POSTs to the test host's control URL,
     CUBE_ACCEPTANCE_CONTROL_URL: integration/checkpoint TestDemo's serve mode).
  d. bad input through raw HTTP: unknown template / snapshot 404, malformed
     JSON and wrong types 400 naming the field, an oversized body 413, a
     missing or wrong API key 401.
  At the end the sandboxes, snapshots and template of the run are deleted and
  the lists show none of them.

Environment: CUBE_API_URL, CUBE_API_KEY, CUBE_TEMPLATE_ID (an image with
/bin/sh, imported into cube-api's namespace), CUBE_WORKER_BIN (the worker,
a static linux/amd64 binary: CGO_ENABLED=0 go build ./integration/snapshot/worker),
CUBE_ACCEPTANCE_CONTROL_URL (POST /restart-api, /restart-containerd; without
it pass --no-restarts, and the run says that part was not run).
`make e2e-sdk` runs it against cube-api in the test host
(contrib/scripts/e2e-sdk.sh). Standard library only.
"""

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cube_sandbox import (CloneException, CommandExitException, ConflictException, InvalidArgumentException,  # noqa: E402
                          NotFoundException, Sandbox, SandboxException, Template, TimeoutException)

WORKER = "/worker"
SOCK = "/tmp/worker.sock"
SANDBOX_TIMEOUT = 1800  # seconds: the run takes about 10 minutes in a 1-vCPU test host
REQUEST_TIMEOUT = 300.0  # a VM restore or snapshot in a TCG test host takes seconds, not minutes


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


class Run:
    def __init__(self, image, worker, control, restarts):
        self.image, self.worker, self.control, self.restarts = image, worker, control, restarts
        self.run = uuid.uuid4().hex[:8]
        self.meta = {"acceptance": self.run}
        self.made = {}  # sandbox id -> Sandbox
        self.snapshots = []  # ids, oldest first
        self.template = None
        self.n = 0
        self.t0 = time.monotonic()

    # --- output -----------------------------------------------------------------------------------------------
    def step(self, name, fn, *a):
        self.n += 1
        start = time.monotonic()
        print("%-5s %-84s" % ("%d." % self.n, name), end="", flush=True)
        try:
            out = fn(*a)
        except BaseException:
            print(" FAILED after %.1f s" % (time.monotonic() - start), flush=True)
            raise
        note = out if isinstance(out, str) else ""
        print(" ok %7.1f s%s" % (time.monotonic() - start, ("  " + note) if note else ""), flush=True)
        return out

    # --- the worker -------------------------------------------------------------------------------------------
    def ask(self, sb, cmd):
        """The worker's answer (a dict), or None when it does not answer."""
        try:
            r = sb.commands.run(WORKER, args=[SOCK, cmd], timeout=60)
        except CommandExitException:
            return None
        try:
            return json.loads(r.stdout.strip())
        except ValueError:
            raise Failed("%s: the worker answered %r to %s, not JSON" % (sb.sandbox_id, r.stdout, cmd)) from None

    def must(self, sb, cmd):
        st = self.ask(sb, cmd)
        check(st is not None, "%s: the worker does not answer %r" % (sb.sandbox_id, cmd))
        return st

    @staticmethod
    def same(a, b):
        return all(a.get(k) == b.get(k) for k in ("counter", "held", "identity", "pid", "digest"))

    @staticmethod
    def show(st):
        return "counter %d, held %s, identity %s…, pid %d, digest %s…" % (
            st["counter"], st["held"], st["identity"][:8], st["pid"], st["digest"][:8])

    def above(self, sb, n, within=60):
        """Waits until the worker answers with a counter above n (it advances)."""
        deadline = time.monotonic() + within
        while True:
            st = self.ask(sb, "query")
            if st is not None and st["counter"] > n:
                return st
            check(time.monotonic() < deadline, "%s: the worker does not advance past %d in %d s (last answer %s)"
                  % (sb.sandbox_id, n, within, st))
            time.sleep(0.3)

    @staticmethod
    def listed(sb, pid):
        return any(c.get("pid") == pid for c in sb.commands.list())

    # --- bookkeeping ------------------------------------------------------------------------------------------
    def create(self, template):
        sb = Sandbox.create(template=template, timeout=SANDBOX_TIMEOUT, metadata=self.meta,
                            request_timeout=REQUEST_TIMEOUT)
        self.made[sb.sandbox_id] = sb
        check(sb.info.get("state") == "running", "%s: created %s, want running" % (sb.sandbox_id, sb.info.get("state")))
        return sb

    def kill(self, sb):
        sb.kill()
        self.made.pop(sb.sandbox_id, None)

    def snapshot(self, sb, name=None):
        snap = sb.create_snapshot(name)
        self.snapshots.append(snap.snapshot_id)
        return snap

    def ours(self):
        """Our sandboxes as the server lists them (every page), by id."""
        out, token = {}, None
        while True:
            page = Sandbox.list(metadata=self.meta, next_token=token, limit=100)
            out.update((s.sandbox_id, s) for s in page)
            token = page.next_token
            if not token:
                return out

    @staticmethod
    def all_snapshots():
        out, token = [], None
        while True:
            page = Sandbox.list_snapshots(next_token=token, limit=100)
            out.extend(page)
            token = page.next_token
            if not token:
                return out

    # --- a. seed probe ----------------------------------------------------------------------------------------
    def part_a(self):
        tid = "acceptance-" + self.run
        tpl = self.step("a. build template %s from %s (through the SDK)" % (tid, self.image),
                        lambda: Template.build(self.image, template_id=tid))
        self.template = tpl.template_id
        check(tpl.template_id == tid, "template id %r, want %r" % (tpl.template_id, tid))
        sb = self.step("a. create a sandbox from the template", self.create, tid)
        with open(self.worker, "rb") as f:
            binary = f.read()

        def start():
            ei = sb.files.write(WORKER, binary, mode=0o755)
            check(ei.size == len(binary), "the worker written is %s bytes, want %d" % (ei.size, len(binary)))
            h = sb.commands.run(WORKER, args=["serve", SOCK], background=True)
            h.disconnect()  # a background command: it runs on
            self.pid = h.pid
            return "pid %d; %s" % (h.pid, self.show(self.above(sb, 0)))
        self.step("a. write the worker (%d KiB) and start it as a background command" % (len(binary) >> 10), start)
        for r in (1, 2, 3):
            sb = self.round(r, sb)
        return sb

    def round(self, r, sb):
        p = "a.%d " % r
        at = self.step(p + "hold the worker in %s" % sb.sandbox_id, lambda: self.must(sb, "hold"))
        check(at["held"], "the worker does not say held: %s" % at)
        snap = self.step(p + "create_snapshot", lambda: self.snapshot(sb, "acceptance-%s-r%d" % (self.run, r)))

        def release():
            st = self.must(sb, "query")
            check(self.same(st, at), "the held worker changed across the snapshot: %s, then %s" % (at, st))
            self.must(sb, "release")
            return self.show(self.above(sb, at["counter"]))
        self.step(p + "unchanged by the snapshot; released, it advances", release)

        def sigkill():
            sb.commands.kill(self.pid)  # SIGKILL
            deadline = time.monotonic() + 60
            while self.listed(sb, self.pid):
                check(time.monotonic() < deadline, "pid %d is still listed 60 s after SIGKILL" % self.pid)
                time.sleep(0.3)
            check(self.ask(sb, "query") is None, "the SIGKILLed worker still answers")
        self.step(p + "SIGKILL the worker (pid %d): gone, no answer" % self.pid, sigkill)

        def rollback():
            rb = sb.rollback(snap.snapshot_id)
            check(rb.sandbox_id == sb.sandbox_id and rb.snapshot_id == snap.snapshot_id, "rollback answered %s" % dict(rb))
            st = self.must(sb, "query")
            check(self.same(st, at), "after the rollback the worker is %s, want the snapshot's %s exactly" % (st, at))
            check(self.listed(sb, self.pid), "after the rollback pid %d is not listed" % self.pid)
            return "%s; memory %s, frozen %.0f ms" % (self.show(st), rb.get("memory"), rb.get("frozenMs", 0))
        self.step(p + "rollback: counter, identity, pid, digest equal exactly", rollback)

        def advance(s):
            self.must(s, "release")
            return self.show(self.above(s, at["counter"]))
        self.step(p + "released, it advances", advance, sb)
        self.step(p + "kill sandbox %s" % sb.sandbox_id, self.kill, sb)
        nb = self.step(p + "Sandbox.create(template=%s)" % snap.snapshot_id, self.create, snap.snapshot_id)
        check(nb.sandbox_id != sb.sandbox_id, "the restored sandbox has the killed one's id")

        def restored():
            st = self.must(nb, "query")
            check(self.same(st, at), "the restored worker is %s, want the snapshot's %s exactly" % (st, at))
            return self.show(st)
        self.step(p + "restored: equal exactly", restored)
        self.step(p + "released, it advances", advance, nb)
        return nb

    # --- b. clone and fork ------------------------------------------------------------------------------------
    def part_b(self, src):
        shared = "from the source %s\n" % self.run
        src.files.write("/shared.txt", shared)
        ident = self.must(src, "query")
        took = []

        def clone():
            start = time.monotonic()
            clones = src.clone(4, concurrency=2, timeout=SANDBOX_TIMEOUT)
            took.append(time.monotonic() - start)
            for c in clones:
                self.made[c.sandbox_id] = c
            check(len(clones) == 4 and len({c.sandbox_id for c in clones} | {src.sandbox_id}) == 5,
                  "clone(4) made %s" % clones)
            return " ".join(c.sandbox_id for c in clones)
        self.step("b. clone(n=4, concurrency=2) of %s" % src.sandbox_id, clone)
        clones = [s for s in self.made.values() if s.sandbox_id != src.sandbox_id]

        def diverge():
            for c in clones:
                got = c.files.read("/shared.txt")
                check(got == shared, "%s: /shared.txt reads %r, want the source's %r" % (c.sandbox_id, got, shared))
                st = self.must(c, "query")
                check(st["identity"] == ident["identity"] and st["pid"] == ident["pid"],
                      "%s: the worker is %s, want the source's identity and pid" % (c.sandbox_id, st))
            for i, c in enumerate(clones):
                c.files.write("/own-%d.txt" % i, c.sandbox_id)
            for i, c in enumerate(clones):
                for j in range(len(clones)):
                    check(c.files.exists("/own-%d.txt" % j) == (i == j),
                          "%s: /own-%d.txt exists=%s (clone %d wrote it)" % (c.sandbox_id, j, not i == j, j))
                check(c.files.read("/own-%d.txt" % i) == c.sandbox_id, "%s: its own file does not read back" % c.sandbox_id)
            for j in range(len(clones)):
                check(not src.files.exists("/own-%d.txt" % j), "the source sees clone %d's file" % j)
            draws = [c.commands.run("cat /proc/sys/kernel/random/uuid").stdout.strip() for c in clones]
            check(len(set(draws)) == len(draws), "the clones' kernel random draws repeat: %s (RNG not reseeded)" % draws)
            return "own files, distinct random draws"
        self.step("b. the clones see the source's file, then diverge", diverge)

        def kill_clones():
            for c in clones:
                self.kill(c)
        self.step("b. kill the 4 clones", kill_clones)

        def refused():
            try:
                src.clone(4, concurrency=2, timeout=10 ** 9)
            except InvalidArgumentException as e:
                check(e.status == 400 and '"timeout"' in e.message, "want 400 naming \"timeout\", got %s" % e)
                self.nothing_but(src, "after the refused clone")
                return str(e)
            raise Failed("clone(4, timeout=10**9) was not refused")
        self.step("b. clone with an out-of-range timeout: 400 naming the field, nothing made", refused)

        deadline = max(2.0, took[0] / 2)

        def cut():
            try:
                made = src.clone(4, concurrency=2, timeout=SANDBOX_TIMEOUT, request_timeout=deadline)
            except CloneException as e:
                check(len(e.errors) == 1 and isinstance(e.errors[0], TimeoutException), "CloneException %s" % e)
            else:
                for c in made:
                    self.made[c.sandbox_id] = c
                raise Failed("clone(4) with a %.1f s deadline (the first took %.1f s) succeeded" % (deadline, took[0]))
            # The request's end cancels the fork on the server, which then deletes the clones it made.
            waited = self.nothing_but(src, "after the failed clone", within=180)
            return "CloneException (TimeoutException); no clone left after %.1f s" % waited
        self.step("b. clone(4) failing mid-fork (client deadline %.1f s): exception, no clone left" % deadline, cut)

        def fork():
            results = None
            for attempt in range(10):
                try:
                    results = src.fork(3, timeout=SANDBOX_TIMEOUT)
                    break
                except ConflictException as e:
                    # The failed clone's fork may still be ending on the server (its temporary snapshot).
                    print("\n      fork: 409 (%s); again in 3 s" % e, end="", flush=True)
                    time.sleep(3)
            check(results is not None, "fork(3): still 409 after 30 s")
            check(len(results) == 3, "fork(3) answered %d items" % len(results))
            for r in results:
                if r.sandbox is not None:
                    self.made[r.sandbox.sandbox_id] = r.sandbox
            for i, r in enumerate(results):
                check(r.error is None and r.sandbox is not None, "fork item %d: %s" % (i, r.error))
                check(r.sandbox.get_info().state == "running", "%s is %s" % (r.sandbox.sandbox_id, r.sandbox.info.state))
                out = r.sandbox.commands.run("echo alive-%d" % i).stdout
                check(out == "alive-%d\n" % i, "%s: echo answered %r" % (r.sandbox.sandbox_id, out))
                self.must(r.sandbox, "query")
            for r in results:
                self.kill(r.sandbox)
            return " ".join(r.sandbox.sandbox_id for r in results)
        self.step("b. fork(count=3): per-item results, each running and answering; killed", fork)

    def nothing_but(self, src, when, within=0):
        """Waits (up to within seconds) until our only sandbox listed is src; returns the wait."""
        start = time.monotonic()
        while True:
            try:
                left = sorted(set(self.ours()) - {src.sandbox_id})
            except SandboxException as e:
                # Seen in the test host: the list answered 504 while the server deleted a cancelled fork's clone
                # (one sandbox's task did not answer in time); within the window, ask again.
                if e.status not in (503, 504) or time.monotonic() - start >= within:
                    raise
                print("\n      list: %s; again in 2 s" % e, end="", flush=True)
                time.sleep(2)
                continue
            if not left:
                return time.monotonic() - start
            check(time.monotonic() - start < within, "%s these sandboxes are left: %s" % (when, left))
            time.sleep(1)

    # --- c. concurrency and restarts --------------------------------------------------------------------------
    def both(self, a, b):
        """Runs a and b at once (two threads); returns [(result or None, exception or None)] * 2."""
        out = [None, None]
        gate = threading.Barrier(2)

        def go(i, fn):
            gate.wait()
            try:
                out[i] = (fn(), None)
            except SandboxException as e:
                out[i] = (None, e)
        ts = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate((a, b))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    def one_refused(self, out, what):
        ok = [r for r, e in out if e is None]
        refused = [e for r, e in out if isinstance(e, ConflictException)]
        other = [e for r, e in out if e is not None and not isinstance(e, ConflictException)]
        check(not other, "%s: %s" % (what, "; ".join(str(e) for e in other)))
        check(len(ok) == 1 and len(refused) == 1, "%s: %d succeeded, %d refused with 409; want one each" % (what, len(ok), len(refused)))
        return ok[0], refused[0]

    def part_c(self, src):
        def two_snapshots():
            out = self.both(lambda: self.snapshot(src), lambda: self.snapshot(src))
            snap, e = self.one_refused(out, "two snapshots at once")
            self.snap_c = snap
            return "%s taken; the other: %s" % (snap.snapshot_id, e.message)
        self.step("c. two create_snapshot at once on %s: one 201, one 409" % src.sandbox_id, two_snapshots)

        def rollback_and_snapshot():
            out = self.both(lambda: src.rollback(self.snap_c.snapshot_id), lambda: self.snapshot(src))
            r, e = self.one_refused(out, "a rollback and a snapshot at once")
            self.must(src, "query")
            return "%s won; the other: %s" % ("the rollback" if "memory" in r else "the snapshot", e.message)
        self.step("c. rollback and create_snapshot at once: one done, one 409", rollback_and_snapshot)
        if not self.restarts:
            self.step("c. restarts NOT RUN (--no-restarts: no control URL)", lambda: None)
            return
        before = {}

        def after(what):
            # containerd's client reconnects with a backoff (at most a few seconds): 503 until it has.
            start, info = time.monotonic(), None
            while info is None:
                try:
                    info = src.get_info()
                except SandboxException as e:
                    if e.status not in (503, None) or time.monotonic() - start > 60:
                        raise Failed("after %s, get_info of %s: %s" % (what, src.sandbox_id, e)) from None
                    time.sleep(0.5)
            waited = time.monotonic() - start
            check(info.state == "running", "after %s %s is %s" % (what, src.sandbox_id, info.state))
            check(src.sandbox_id in self.ours(), "after %s %s is not listed" % (what, src.sandbox_id))
            st = self.above(src, before["counter"])
            check(st["identity"] == before["identity"] and st["pid"] == before["pid"],
                  "after %s the worker is %s, want identity and pid %s" % (what, st, before))
            return "%s (answered after %.1f s)" % (self.show(st), waited)

        def restore(snap_id, what):
            sb = self.create(snap_id)
            st = self.must(sb, "query")
            check(st["identity"] == before["identity"], "%s: restored from %s, the worker is %s" % (what, snap_id, st))
            self.kill(sb)
            return sb.sandbox_id

        def restart(path):
            before.update(self.must(src, "query"))
            return self.post_control(path)
        self.step("c. restart cube-api (POST %s/restart-api)" % self.control, restart, "/restart-api")
        self.step("c. after the cube-api restart: running, listed, the worker answers and advances",
                  after, "the cube-api restart")
        self.step("c. after the cube-api restart: a snapshot taken before restores",
                  restore, self.snap_c.snapshot_id, "after the cube-api restart")
        self.step("c. restart containerd (POST %s/restart-containerd)" % self.control, restart, "/restart-containerd")
        self.step("c. after the containerd restart: running, listed, the worker answers and advances",
                  after, "the containerd restart")
        snap_d = self.step("c. after the containerd restart: create_snapshot", self.snapshot, src)
        self.step("c. after the containerd restart: it restores", restore, snap_d.snapshot_id, "after the containerd restart")

    def post_control(self, path):
        req = urllib.request.Request(self.control + path, method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=240) as resp:
                return resp.read().decode().strip()
        except urllib.error.HTTPError as e:
            raise Failed("POST %s%s: %d %s" % (self.control, path, e.code, e.read().decode(errors="replace").strip())) from None
        except OSError as e:
            raise Failed("POST %s%s: %s" % (self.control, path, e)) from None

    # --- d. bad input -----------------------------------------------------------------------------------------
    def raw(self, method, path, body=None, key="default", ctype="application/json"):
        url = os.environ.get("CUBE_API_URL", "http://127.0.0.1:3000").rstrip("/") + path
        headers = {}
        if body is not None:
            headers["Content-Type"] = ctype
        if key == "default":
            key = os.environ.get("CUBE_API_KEY")
        if key:
            headers["Authorization"] = "Bearer " + key
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def expect(self, status, names, method, path, body=None, key="default"):
        code, raw = self.raw(method, path, body, key)
        try:
            msg = json.loads(raw)
        except ValueError:
            raise Failed("%s %s: answer %d is not JSON: %r" % (method, path, code, raw[:200])) from None
        if code == 201 and isinstance(msg, dict) and msg.get("sandboxID"):
            self.made[msg["sandboxID"]] = Sandbox(msg["sandboxID"])  # made where it should not be: removed at cleanup
        check(code == status and msg.get("code") == status,
              "%s %s: %d %s, want %d" % (method, path, code, msg, status))
        for n in names:
            check(n in msg.get("message", ""), "%s %s: %d %r does not name %s" % (method, path, code, msg.get("message"), n))
        return msg["message"]

    def part_d(self, sb):
        sid = sb.sandbox_id
        cases = [
            ("unknown template: 404", 404, ["acceptance-no-such-template"], "POST", "/sandboxes",
             {"templateID": "acceptance-no-such-template"}),
            ("unknown snapshot id as template: 404", 404, ["0123456789abcdef01234567"], "POST", "/sandboxes",
             {"templateID": "0123456789abcdef01234567"}),
            ("rollback to an unknown snapshot: 404 naming snapshotID", 404, ['"snapshotID"'], "POST",
             "/sandboxes/%s/rollback" % sid, {"snapshotID": "acceptance-no-such-snapshot"}),
            ("unknown snapshot: 404", 404, [], "GET", "/snapshots/acceptance-no-such-snapshot", None),
            ("malformed JSON: 400", 400, ["malformed JSON"], "POST", "/sandboxes", b'{"templateID": "x",,}'),
            ("templateID a number: 400 naming it", 400, ['"templateID"'], "POST", "/sandboxes", {"templateID": 5}),
            ("timeout a string: 400 naming it", 400, ['"timeout"'], "POST", "/sandboxes",
             {"templateID": self.image, "timeout": "60"}),
            ("fork count a string: 400 naming it", 400, ['"count"'], "POST", "/sandboxes/%s/fork" % sid, {"count": "3"}),
            # (Go's encoding/json matches field names case-insensitively: "templateId" is templateID, not unknown.)
            ("an unknown field: 400 naming it", 400, ['"acceptanceUnknown"'], "POST", "/sandboxes",
             {"templateID": self.image, "acceptanceUnknown": 1}),
            ("a body over 1 MiB (max_body_bytes): 413", 413, [], "POST", "/sandboxes",
             {"templateID": self.image, "metadata": {"big": "x" * ((1 << 20) + 1024)}}),
        ]
        for name, status, names, method, path, body in cases:
            self.step("d. " + name, self.expect, status, names, method, path, body)
        self.step("d. no API key: 401", self.expect, 401, [], "GET", "/v2/sandboxes", None, None)
        self.step("d. a wrong API key: 401", self.expect, 401, [], "GET", "/v2/sandboxes", None, "wrong-key-" + self.run)

        def right():
            code, _ = self.raw("GET", "/v2/sandboxes")
            check(code == 200, "GET /v2/sandboxes with the key: %d" % code)
        self.step("d. the right API key: 200", right)
        self.nothing_but(sb, "after the bad requests")

    # --- the end ----------------------------------------------------------------------------------------------
    def cleanup(self):
        problems = []
        try:  # also any the run made without knowing (a clone whose fork's answer was lost)
            for sid in set(self.ours()) - set(self.made):
                self.made[sid] = Sandbox(sid)
        except SandboxException as e:
            problems.append("list the run's sandboxes: %s" % e)
        for sb in list(self.made.values()):
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.kill(sb)
                    break
                except NotFoundException:
                    self.made.pop(sb.sandbox_id, None)
                    break
                except SandboxException as e:
                    # 409 "it is deleted": the server is deleting it (a cancelled fork's clone): until it is gone.
                    if e.status != 409 or time.monotonic() > deadline:
                        problems.append("kill %s: %s" % (sb.sandbox_id, e))
                        break
                    time.sleep(2)
        for sid in reversed(self.snapshots):
            deadline = time.monotonic() + 30
            while True:
                try:
                    Sandbox.delete_snapshot(sid)
                    break
                except NotFoundException:
                    break
                except ConflictException as e:
                    if time.monotonic() > deadline:
                        problems.append("delete snapshot %s: %s" % (sid, e))
                        break
                    time.sleep(1)
                except SandboxException as e:
                    problems.append("delete snapshot %s: %s" % (sid, e))
                    break
        if self.template:
            try:
                Template.delete(self.template)
            except NotFoundException:
                pass
            except SandboxException as e:
                problems.append("delete template %s: %s" % (self.template, e))
        return problems

    def verify_empty(self):
        left = self.ours()
        check(not left, "sandboxes of this run are listed: %s" % sorted(left))
        snaps = {s.snapshot_id for s in self.all_snapshots()}
        ours = snaps & set(self.snapshots)
        check(not ours, "snapshots of this run are listed: %s" % sorted(ours))
        try:
            Template.get(self.template)
            raise Failed("template %s is still there" % self.template)
        except NotFoundException:
            pass
        return "no sandbox, snapshot or template of run %s listed (%d snapshots, %d others listed)" % (
            self.run, len(self.snapshots), len(snaps))


def main():
    p = argparse.ArgumentParser(description="Issue 15's acceptance through the Python SDK against cube-api "
                                            "(CUBE_API_URL, CUBE_API_KEY, CUBE_TEMPLATE_ID, CUBE_WORKER_BIN, "
                                            "CUBE_ACCEPTANCE_CONTROL_URL).")
    p.add_argument("--no-restarts", action="store_true",
                   help="do not restart cube-api and containerd (no control URL; the run says so)")
    a = p.parse_args()
    image = os.environ.get("CUBE_TEMPLATE_ID")
    worker = os.environ.get("CUBE_WORKER_BIN")
    control = (os.environ.get("CUBE_ACCEPTANCE_CONTROL_URL") or "").rstrip("/")
    if not image:
        p.error("CUBE_TEMPLATE_ID is not set: an image imported into cube-api's namespace, with /bin/sh")
    if not worker or not os.path.isfile(worker):
        p.error("CUBE_WORKER_BIN=%r is not a file: build the worker with "
                "CGO_ENABLED=0 go build -o worker ./integration/snapshot/worker" % worker)
    if not control and not a.no_restarts:
        p.error("CUBE_ACCEPTANCE_CONTROL_URL is not set (POST /restart-api, /restart-containerd): "
                "set it, or pass --no-restarts")
    r = Run(image, worker, control, not a.no_restarts)
    print("acceptance %s: the Python SDK against cube-api at %s, image %s" % (
        r.run, os.environ.get("CUBE_API_URL", "http://127.0.0.1:3000"), image), flush=True)
    failure = None
    try:
        src = r.part_a()
        r.part_d(src)
        r.part_b(src)
        r.part_c(src)
    except (Failed, SandboxException) as e:
        failure = "%s: %s" % (type(e).__name__, e)
    problems = r.step("cleanup: kill the run's sandboxes, delete its snapshots and template", r.cleanup)
    if failure is None and not problems:
        try:
            r.step("nothing made remains (lists through the SDK)", r.verify_empty)
        except (Failed, SandboxException) as e:
            failure = "%s: %s" % (type(e).__name__, e)
    took = time.monotonic() - r.t0
    if failure is not None:
        print("acceptance: FAILED after %.0f s: %s" % (took, failure), file=sys.stderr)
        if problems:
            print("acceptance: cleanup left: %s" % "; ".join(problems), file=sys.stderr)
        return 1
    if problems:
        print("acceptance: FAILED: cleanup left: %s" % "; ".join(problems), file=sys.stderr)
        return 1
    print("acceptance: every step held (%.0f s)" % took)
    return 0


if __name__ == "__main__":
    sys.exit(main())
