"""The SDK against a fake cube-api (tests/fakeapi.py): python3 -m unittest
discover -s tests (from contrib/sdk/python)."""

import os
import threading
import time
import unittest
from unittest import mock

from cube_sandbox import (AuthenticationException, CloneException, CommandExitException, ConflictException,
                          ForkResult, InvalidArgumentException, NotFoundException, NotImplementedException, Sandbox,
                          SandboxException, Template, TimeoutException)

from cube_sandbox._http import ConnectionConfig

from . import fakeapi


class Base(unittest.TestCase):
    def setUp(self):
        self.srv, self.st, self.url = fakeapi.start()
        env = {"CUBE_API_URL": self.url + "/", "CUBE_API_KEY": fakeapi.KEY, "CUBE_TEMPLATE_ID": "busybox"}
        p = mock.patch.dict(os.environ, env)
        p.start()
        self.addCleanup(p.stop)
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)


class TestSandbox(Base):
    def test_create_uses_env_and_fields(self):
        sb = Sandbox.create(timeout=60, metadata={"k": "v"}, envs={"A": "1"})
        self.assertEqual(len(sb.sandbox_id), 20)
        self.assertEqual(sb.info.template_id, "busybox")
        method, path, body, headers = self.st.requests[-1]
        self.assertEqual((method, path), ("POST", "/sandboxes"))
        self.assertEqual(body, {"templateID": "busybox", "timeout": 60, "metadata": {"k": "v"},
                                "envVars": {"A": "1"}, "autoPause": False})
        self.assertEqual(headers["Authorization"], "Bearer " + fakeapi.KEY)

    def test_network(self):
        sb = Sandbox.create(allow_internet_access=False, network={"allowOut": ["10.0.0.0/8"]})
        method, path, body, _ = self.st.requests[-1]
        self.assertEqual(body["allow_internet_access"], False)
        self.assertEqual(body["network"], {"allowOut": ["10.0.0.0/8"]})
        out = sb.set_network(allow_internet_access=False, allow_out=["1.2.3.4"])
        self.assertEqual(out["allowOut"], ["1.2.3.4"])
        method, path, body, _ = self.st.requests[-1]
        self.assertEqual((method, path), ("PUT", "/sandboxes/%s/network" % sb.sandbox_id))
        self.assertEqual(body, {"allow_internet_access": False, "allowOut": ["1.2.3.4"]})
        with self.assertRaises(InvalidArgumentException):
            sb.set_network(allow_out=["nope"])
        with self.assertRaises(NotFoundException):
            Sandbox.set_network("sb-nope", allow_out=["1.2.3.4"])
        self.assertEqual(sb.get_host(8080), "8080-%s.%s" % (sb.sandbox_id, self.url.split("://")[1].rstrip("/")))

    def test_errors_map_to_exceptions(self):
        with self.assertRaises(NotFoundException) as cm:
            Sandbox.create(template="nope")
        self.assertEqual(cm.exception.status, 404)
        self.assertIn("unknown template", str(cm.exception))
        self.assertTrue(cm.exception.request_id)
        with self.assertRaises(InvalidArgumentException) as cm:
            ConnectionConfig().call("POST", "/sandboxes", body={"templateID": "busybox", "timeout": "soon"})
        self.assertIn('"timeout"', str(cm.exception))
        with self.assertRaises(AuthenticationException):
            Sandbox.create(api_key="wrong")
        with mock.patch.dict(os.environ, {"CUBE_TEMPLATE_ID": ""}):
            with self.assertRaises(InvalidArgumentException):
                Sandbox.create()
        with self.assertRaises(SandboxException) as cm:
            Sandbox.create(api_url="http://127.0.0.1:1")
        self.assertIn("cannot reach cube-api", str(cm.exception))

    def test_lifecycle(self):
        sb = Sandbox.create()
        sb.pause()
        self.assertEqual(sb.get_info().state, "paused")
        with self.assertRaises(ConflictException):
            sb.pause()
        sb.resume(timeout=30)
        self.assertEqual(sb.info.state, "running")
        self.assertEqual(sb.info.timeout, 30)
        sb.set_timeout(120)
        self.assertEqual(sb.get_info().timeout, 120)
        self.assertTrue(sb.is_running())
        Sandbox.pause(sb.sandbox_id)  # on the class, with an id
        again = Sandbox.connect(sb.sandbox_id, timeout=10)
        self.assertEqual(again.info.state, "running")
        Sandbox.kill(sb.sandbox_id)
        with self.assertRaises(NotFoundException):
            sb.get_info()
        with self.assertRaises(NotFoundException):
            Sandbox.connect(sb.sandbox_id)

    def test_context_manager_kills(self):
        with Sandbox.create() as sb:
            sid = sb.sandbox_id
            self.assertIn(sid, self.st.sandboxes)
        self.assertNotIn(sid, self.st.sandboxes)
        with Sandbox.create() as sb:  # killed already inside: no error on exit
            sb.kill()

    def test_list_filters_and_pages(self):
        a = Sandbox.create(metadata={"team": "a"})
        Sandbox.create(metadata={"team": "b"})
        c = Sandbox.create(metadata={"team": "a", "n": "3"})
        c.pause()
        self.assertEqual([s.sandbox_id for s in Sandbox.list(metadata={"team": "a"})], [a.sandbox_id, c.sandbox_id])
        self.assertEqual([s.sandbox_id for s in Sandbox.list(state="paused")], [c.sandbox_id])
        self.assertEqual(len(Sandbox.list(state=["running", "paused"])), 3)
        p1 = Sandbox.list(limit=2)
        self.assertEqual(len(p1), 2)
        self.assertTrue(p1.next_token)
        p2 = Sandbox.list(limit=2, next_token=p1.next_token)
        self.assertEqual(len(p2), 1)
        self.assertIsNone(p2.next_token)


class TestCommands(Base):
    def test_run_foreground(self):
        sb = Sandbox.create()
        out = []
        r = sb.commands.run("echo hello", envs={"X": "1"}, on_stdout=out.append)
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "hello\nX=1\n")
        self.assertEqual("".join(out), r.stdout)
        _, _, body, _ = self.st.requests[-1]
        self.assertEqual(body, {"cmd": "/bin/sh", "args": ["-c", "echo hello"], "envs": {"X": "1"}})
        r = sb.commands.run("pwd", args=[], cwd="/tmp", user="1000")
        self.assertEqual(r.stdout, "/tmp 1000\n")

    def test_non_zero_exit_raises(self):
        sb = Sandbox.create()
        errs = []
        with self.assertRaises(CommandExitException) as cm:
            sb.commands.run("exit 3", on_stderr=errs.append)
        self.assertEqual(cm.exception.exit_code, 3)
        self.assertEqual(cm.exception.stderr, "bye\n")
        self.assertEqual(errs, ["bye\n"])

    def test_background_stdin_list_kill(self):
        sb = Sandbox.create()
        cat = sb.commands.run("cat", background=True, stdin=True)
        sleep = sb.commands.run("sleep", background=True)
        self.assertEqual(sorted(c["pid"] for c in sb.commands.list()), sorted([cat.pid, sleep.pid]))
        cat.send_stdin("abc")
        cat.close_stdin()
        self.assertEqual(cat.wait().stdout, "abc")
        sleep.kill(signal="SIGTERM")
        with self.assertRaises(CommandExitException) as cm:
            sleep.wait(5)
        self.assertEqual(cm.exception.exit_code, 128 + 15)
        with self.assertRaises(NotFoundException):
            sb.commands.kill(99999)

    def test_disconnect_returns_while_silent(self):
        # A command that prints nothing: disconnect must not wait for a line.
        sb = Sandbox.create()
        sleep = sb.commands.run("sleep", background=True)
        done = threading.Event()
        threading.Thread(target=lambda: (sleep.disconnect(), done.set()), daemon=True).start()
        self.assertTrue(done.wait(5), "disconnect blocked on the silent stream")
        with self.assertRaises(SandboxException) as cm:
            sleep.wait(5)
        self.assertIn("disconnected", str(cm.exception))
        self.assertIn(sleep.pid, [c["pid"] for c in sb.commands.list()])
        sleep.kill()

    def test_timeout_kills(self):
        sb = Sandbox.create()
        with self.assertRaises(TimeoutException):
            sb.commands.run("sleep", timeout=0.2)

    def test_unknown_sandbox(self):
        with self.assertRaises(NotFoundException):
            Sandbox("nope").commands.run("echo x")

    def test_concurrent_runs(self):
        sb = Sandbox.create()
        results = []

        def one(i):
            results.append(sb.commands.run("echo %d" % i).stdout)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(sorted(results), ["%d\n" % i for i in range(5)])


class TestSnapshots(Base):
    def test_snapshots(self):
        sb = Sandbox.create()
        s1 = sb.create_snapshot("one")
        self.assertEqual(s1.names, ["one"])
        self.assertEqual(s1.sandbox_id, sb.sandbox_id)
        self.assertEqual(s1.frozen_ms, 1.5)
        with self.assertRaises(ConflictException):
            sb.create_snapshot("one")
        s2 = sb.create_snapshot()
        p1 = Sandbox.list_snapshots(sandbox_id=sb.sandbox_id, limit=1)
        self.assertEqual([s.snapshot_id for s in p1], [s1.snapshot_id])
        p2 = Sandbox.list_snapshots(sb.sandbox_id, 1, p1.next_token)
        self.assertEqual([s.snapshot_id for s in p2], [s2.snapshot_id])
        self.assertIsNone(p2.next_token)
        self.assertEqual(Sandbox.get_snapshot("one").snapshot_id, s1.snapshot_id)
        self.st.snapshots[0]["inUse"] = True
        with self.assertRaises(ConflictException):
            Sandbox.delete_snapshot("one")
        self.st.snapshots[0]["inUse"] = False
        self.assertTrue(Sandbox.delete_snapshot(s1.snapshot_id))
        with self.assertRaises(NotFoundException):
            Sandbox.get_snapshot("one")
        # Snapshots outlive their sandbox.
        sb.kill()
        self.assertEqual(len(Sandbox.list_snapshots()), 1)

    def test_rollback(self):
        sb = Sandbox.create()
        snap = sb.create_snapshot("one")
        dropped = []
        sb._conn.drop_connections = lambda: dropped.append(True)
        rb = sb.rollback("one")
        self.assertEqual(rb.sandbox_id, sb.sandbox_id)
        self.assertEqual(rb.snapshot_id, snap.snapshot_id)
        self.assertEqual(rb.processes[0]["action"], "unknown")
        self.assertEqual(dropped, [True])
        method, path, body, _ = self.st.requests[-1]
        self.assertEqual((method, path, body), ("POST", "/sandboxes/%s/rollback" % sb.sandbox_id, {"snapshotID": "one"}))
        # On the class, by id.
        self.assertEqual(Sandbox.rollback(sb.sandbox_id, snap.snapshot_id).snapshot_id, snap.snapshot_id)
        with self.assertRaises(NotFoundException):
            sb.rollback("nope")
        self.st.sandboxes[sb.sandbox_id]["busy"] = True
        with self.assertRaises(ConflictException):
            sb.rollback("one")
        self.assertEqual(len(dropped), 1)  # not after a failure

    def test_not_implemented(self):
        with self.assertRaises(NotImplementedException):
            ConnectionConfig().call("POST", "/fake/not-implemented", body={})


class TestForkAndClone(Base):
    def test_create_from_snapshot(self):
        sb = Sandbox.create()
        snap = sb.create_snapshot("one")
        for ref in (snap.snapshot_id, "one"):
            again = Sandbox.create(template=ref)
            self.assertEqual(again.info.template_id, ref)
            self.assertNotEqual(again.sandbox_id, sb.sandbox_id)
            self.assertEqual(self.st.requests[-1][2]["templateID"], ref)
        with self.assertRaises(NotFoundException) as cm:
            Sandbox.create(template="0123456789abcdef01234567")
        self.assertIn("0123456789abcdef01234567", str(cm.exception))

    def test_fork(self):
        sb = Sandbox.create(metadata={"k": "v"})
        res = sb.fork(3, timeout=60)
        method, path, body, _ = self.st.requests[-1]
        self.assertEqual((method, path, body), ("POST", "/sandboxes/%s/fork" % sb.sandbox_id,
                                                {"count": 3, "allOrNothing": False, "timeout": 60}))
        self.assertEqual(len(res), 3)
        self.assertTrue(all(r.error is None and r.sandbox.info.metadata == {"k": "v"} for r in res))
        self.assertEqual(len({r.sandbox.sandbox_id for r in res}), 3)
        self.assertTrue(res[0].sandbox.commands.run("echo hi").stdout.startswith("hi"))
        # Per-item results: the second fails, the others are made.
        self.st.made, self.st.fail_at = 0, {2}
        res = Sandbox.fork(sb.sandbox_id, 3)
        self.assertIsNotNone(res[0].sandbox)
        self.assertIsInstance(res[1].error, SandboxException)
        self.assertEqual(res[1].error.status, 500)
        self.assertIsNotNone(res[2].sandbox)
        with self.assertRaises(InvalidArgumentException):
            sb.fork(0)
        self.assertEqual(self.st.snapshots, [])  # the temporary snapshots are gone

    def test_clone_all_or_nothing(self):
        sb = Sandbox.create()
        clones = sb.clone(4, concurrency=2)
        self.assertEqual(len(clones), 4)
        self.assertEqual(self.st.requests[-1][2], {"count": 4, "allOrNothing": True})
        before = set(self.st.sandboxes)
        self.st.made, self.st.fail_at = 0, {3}
        with self.assertRaises(CloneException) as cm:
            sb.clone(4, concurrency=2)
        self.assertTrue(cm.exception.errors)
        self.assertEqual(set(self.st.sandboxes), before)  # no clone left
        self.assertEqual(self.st.snapshots, [])  # nor the temporary snapshot
        with self.assertRaises(InvalidArgumentException):
            sb.clone(2, concurrency=3)
        with self.assertRaises(InvalidArgumentException):
            sb.clone(0)

    def test_clone_kills_what_the_server_returned(self):
        # A server that answered some sandboxes beside an error: clone kills them.
        sb = Sandbox.create()
        made = Sandbox.create()
        with mock.patch.object(Sandbox, "fork", lambda self, n, timeout=None, all_or_nothing=False, request_timeout=None: [
                ForkResult(made, None), ForkResult(None, SandboxException("boom", status=500))]):
            with self.assertRaises(CloneException):
                sb.clone(2)
        self.assertNotIn(made.sandbox_id, self.st.sandboxes)


    def test_clone_past_its_request_timeout(self):
        # No answer in time: CloneException holding a TimeoutException, at once (not after the fork's end).
        sb = Sandbox.create()
        self.st.fork_delay = 1.0
        with self.assertRaises(CloneException) as cm:
            sb.clone(2, request_timeout=0.2)
        self.assertEqual(len(cm.exception.errors), 1)
        self.assertIsInstance(cm.exception.errors[0], TimeoutException)
        self.assertIsNone(cm.exception.errors[0].status)
        self.assertIn("within 0.2s", str(cm.exception))
        # fork itself raises the TimeoutException.
        with self.assertRaises(TimeoutException):
            sb.fork(1, request_timeout=0.2)
        # An answer with an error status is raised as it is (nothing was made).
        self.st.fork_delay = 0
        with self.assertRaises(InvalidArgumentException):
            Sandbox.clone(sb.sandbox_id, 101)

    def test_fork_waits_longer_than_the_connection(self):
        sb = Sandbox.create()
        seen = []
        real = sb._conn.call

        def call(method, path, query=None, body=None, data=None, timeout=None):
            seen.append(timeout)
            return real(method, path, query, body, data, timeout)
        with mock.patch.object(sb._conn, "call", call):
            sb.fork(1)
            sb.fork(1, request_timeout=7)
        self.assertEqual(seen, [600.0, 7])


class TestTransport(unittest.TestCase):
    """Failures below HTTP are SandboxExceptions (status None), not socket or http.client errors."""

    def serve_once(self, answer):
        # A server that reads the request, then sends answer (bytes) and closes.
        import socket
        ln = socket.socket()
        ln.bind(("127.0.0.1", 0))
        ln.listen(1)
        self.addCleanup(ln.close)

        def run():
            c, _ = ln.accept()
            with c:
                c.recv(65536)
                if answer is None:
                    time.sleep(1.0)
                    return
                c.sendall(answer)
        threading.Thread(target=run, daemon=True).start()
        return ConnectionConfig("http://127.0.0.1:%d" % ln.getsockname()[1], "k", request_timeout=0.2)

    def test_closed_without_answer(self):
        conn = self.serve_once(b"")
        with self.assertRaises(SandboxException) as cm:
            conn.call("GET", "/v2/sandboxes")
        self.assertIsNone(cm.exception.status)
        self.assertIn("GET /v2/sandboxes: the connection to cube-api", str(cm.exception))

    def test_body_cut_short(self):
        conn = self.serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[1,")
        with self.assertRaises(SandboxException) as cm:
            conn.call("GET", "/v2/sandboxes")
        self.assertIsNone(cm.exception.status)
        self.assertIn("IncompleteRead", str(cm.exception))

    def test_no_answer_in_time(self):
        conn = self.serve_once(None)
        with self.assertRaises(TimeoutException) as cm:
            conn.call("GET", "/v2/sandboxes")
        self.assertIsNone(cm.exception.status)
        self.assertIn("within 0.2s", str(cm.exception))


class TestTemplates(Base):
    def test_templates(self):
        t = Template.build("busybox", template_id="py", ready_cmd=["true"], ready_timeout=30, envs={"A": "1"})
        self.assertEqual((t.template_id, t.image, t.build_ms), ("py", "busybox", 12.5))
        method, path, body, _ = self.st.requests[-1]
        self.assertEqual((method, path, body), ("POST", "/templates", {"image": "busybox", "templateID": "py",
                                                                       "readyCmd": ["true"], "readyTimeout": 30, "envVars": {"A": "1"}}))
        gen = Template.build("busybox")
        self.assertTrue(gen.template_id.startswith("tpl-"))
        self.assertEqual([x.template_id for x in Template.list()], ["py", gen.template_id])
        self.assertEqual(Template.get("py").snapshot_id, t.snapshot_id)
        sb = Sandbox.create(template="py")
        self.assertEqual(sb.info.template_id, "py")
        with self.assertRaises(ConflictException):
            Template.build("busybox", template_id="py")
        with self.assertRaises(NotFoundException):
            Template.build("nope")
        with self.assertRaises(TimeoutException):
            Template.build("busybox", ready_cmd=["false"])
        self.assertTrue(Template.delete("py"))
        with self.assertRaises(NotFoundException):
            Template.get("py")
        with self.assertRaises(NotFoundException):
            Template.delete("py")
        with self.assertRaises(NotFoundException):
            Sandbox.create(template="py")


class TestFiles(Base):
    def test_files(self):
        sb = Sandbox.create()
        data = b"\x00\xffbinary" * 1000
        info = sb.files.write("/home/user/d/a b.bin", data, mode=0o600)
        self.assertEqual((info.name, info.size, info.type), ("a b.bin", len(data), "file"))
        _, path, body, headers = self.st.requests[-1]
        self.assertEqual(headers["Content-Type"], "application/octet-stream")
        self.assertEqual(body, data)
        self.assertEqual(sb.files.read("/home/user/d/a b.bin", format="bytes"), data)
        self.assertEqual(sb.files.read("/home/user/d/a b.bin", format="bytes", offset=1, length=2), b"\xffb")
        sb.files.write("/home/user/d/t.txt", "héllo ")
        sb.files.write("/home/user/d/t.txt", "world", append=True)
        self.assertEqual(sb.files.read("/home/user/d/t.txt"), "héllo world")
        self.assertTrue(sb.files.make_dir("/home/user/d/sub"))
        self.assertFalse(sb.files.make_dir("/home/user/d/sub"))
        sb.files.write("/home/user/d/z", b"")
        # More than one page (the fake's pages hold 2 entries).
        self.assertEqual([e.name for e in sb.files.list("/home/user/d")], ["a b.bin", "sub", "t.txt", "z"])
        self.assertEqual(sb.files.get_info("/home/user/d/sub").type, "dir")
        with self.assertRaises(ConflictException):
            sb.files.remove("/home/user/d")
        sb.files.remove("/home/user/d", recursive=True)
        self.assertFalse(sb.files.exists("/home/user/d"))
        with self.assertRaises(NotFoundException):
            sb.files.read("/home/user/d/t.txt")
        with self.assertRaises(InvalidArgumentException):
            sb.files.read("relative")


if __name__ == "__main__":
    unittest.main()


class TestAcceptanceScript(unittest.TestCase):
    """examples/acceptance.py needs a real cube-api (make e2e-sdk); here only its refusal of a missing setting,
    so that a script that no longer loads or parses its settings fails the unit suite."""

    def run_script(self, env):
        import subprocess
        import sys
        script = os.path.join(os.path.dirname(__file__), "..", "examples", "acceptance.py")
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CUBE_")}
        return subprocess.run([sys.executable, "-B", script], env=dict(clean, **env), capture_output=True, text=True,
                              timeout=60)

    def test_names_what_is_missing(self):
        r = self.run_script({})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("CUBE_TEMPLATE_ID is not set", r.stderr)
        r = self.run_script({"CUBE_TEMPLATE_ID": "busybox", "CUBE_WORKER_BIN": "/nonexistent/worker"})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("CUBE_WORKER_BIN='/nonexistent/worker' is not a file", r.stderr)
        r = self.run_script({"CUBE_TEMPLATE_ID": "busybox", "CUBE_WORKER_BIN": __file__})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("CUBE_ACCEPTANCE_CONTROL_URL is not set", r.stderr)
