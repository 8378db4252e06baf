"""Commands in a sandbox: run in the foreground (wait for the exit) or in the
background (a CommandHandle), output streamed to callbacks as it comes."""

import json
import socket
import threading
import urllib.parse

from .exceptions import CommandExitException, SandboxException, TimeoutException


class CommandResult:
    """A finished command."""

    def __init__(self, exit_code, stdout, stderr, error=None):
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.error = error

    def __repr__(self):
        return "CommandResult(exit_code=%r, stdout=%r, stderr=%r)" % (self.exit_code, self.stdout, self.stderr)


class CommandHandle:
    """A started command. wait() returns its CommandResult (a non-zero exit
    raises CommandExitException); disconnect() stops reading, the command
    runs on; kill() ends it."""

    def __init__(self, commands, pid, resp, on_stdout, on_stderr):
        self.pid = pid
        self._commands = commands
        self._resp = resp
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self._stdout, self._stderr = [], []
        self._result = None
        self._exc = None
        self._disconnected = False
        self._thread = threading.Thread(target=self._read, name="cube-command-%d" % pid, daemon=True)
        self._thread.start()

    @property
    def stdout(self):
        return "".join(self._stdout)

    @property
    def stderr(self):
        return "".join(self._stderr)

    def _read(self):
        try:
            for line in self._resp:
                if not line.strip():
                    continue
                ev = json.loads(line)
                t = ev.get("type")
                if t == "stdout":
                    self._stdout.append(ev.get("data", ""))
                    if self._on_stdout:
                        self._on_stdout(ev.get("data", ""))
                elif t == "stderr":
                    self._stderr.append(ev.get("data", ""))
                    if self._on_stderr:
                        self._on_stderr(ev.get("data", ""))
                elif t in ("exit", "error"):
                    self._result = CommandResult(ev.get("exitCode", -1) if t == "exit" else -1,
                                                 self.stdout, self.stderr, ev.get("error"))
                    return
            raise SandboxException("command %d: the output stream ended before its exit" % self.pid)
        except Exception as e:
            if self._disconnected:
                self._exc = SandboxException("command %d: disconnected (it runs on; list it with commands.list())" % self.pid)
            elif isinstance(e, SandboxException):
                self._exc = e
            else:
                self._exc = SandboxException("command %d: the output stream broke: %s" % (self.pid, e))
        finally:
            try:
                self._resp.close()
            except Exception:
                pass

    def wait(self, timeout=None):
        """Waits for the exit (at most timeout seconds: then the command is
        killed and TimeoutException raised)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            try:
                self.kill()
            except SandboxException:
                pass
            raise TimeoutException("command %d ran longer than %ss and was killed" % (self.pid, timeout))
        if self._result is None:
            raise self._exc
        r = self._result
        if r.error is not None or r.exit_code != 0:
            raise CommandExitException(r.exit_code, r.stdout, r.stderr, r.error)
        return r

    def disconnect(self):
        """Stops reading the output; the command runs on in the sandbox.
        Returns at once (the reading thread ends by itself)."""
        self._disconnected = True
        # Closing the response while the reading thread is blocked in it
        # waits for the next line, which may never come: shut the socket
        # down instead, and the blocked read returns.
        sock = getattr(getattr(getattr(self._resp, "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                return
            except OSError:
                pass
        threading.Thread(target=self._close_quietly, daemon=True).start()

    def _close_quietly(self):
        try:
            self._resp.close()
        except Exception:
            pass

    def kill(self, signal=None):
        """Sends SIGKILL (or signal, e.g. "SIGTERM")."""
        return self._commands.kill(self.pid, signal)

    def send_stdin(self, data):
        """Writes data (str) to the command's stdin (started with stdin=True)."""
        return self._commands.send_stdin(self.pid, data)

    def close_stdin(self):
        return self._commands.close_stdin(self.pid)


class Commands:
    """sandbox.commands"""

    def __init__(self, sandbox):
        self._sb = sandbox

    def _path(self, suffix=""):
        return "/sandboxes/%s/commands%s" % (urllib.parse.quote(self._sb.sandbox_id, safe=""), suffix)

    def run(self, cmd, background=False, envs=None, cwd=None, user=None, on_stdout=None, on_stderr=None,
            stdin=False, timeout=None, args=None):
        """Runs cmd, a shell command line (/bin/sh -c cmd) or, with args, a
        program. Foreground: returns a CommandResult once it exits (non-zero:
        CommandExitException; past timeout seconds: killed, TimeoutException).
        background=True: returns a CommandHandle once it started."""
        if args is None:
            body = {"cmd": "/bin/sh", "args": ["-c", cmd]}
        else:
            body = {"cmd": cmd, "args": list(args)}
        if envs:
            body["envs"] = dict(envs)
        if cwd:
            body["cwd"] = cwd
        if user:
            body["user"] = user
        if stdin:
            body["stdin"] = True
        # No read timeout on the stream: output may pause for long.
        resp = self._sb._conn.open("POST", self._path(), body=body, timeout=3600 * 24)
        first = resp.readline()
        try:
            start = json.loads(first)
        except ValueError:
            start = {}
        if start.get("type") != "start":
            resp.close()
            raise SandboxException("command stream did not start: %r" % first)
        h = CommandHandle(self, start["pid"], resp, on_stdout, on_stderr)
        if background:
            return h
        return h.wait(timeout)

    def list(self):
        """The running commands: dicts with pid, cmd, args, cwd, user, startedAt."""
        out, _ = self._sb._conn.call("GET", self._path())
        return out

    def kill(self, pid, signal=None):
        body = {"signal": signal} if signal else None
        self._sb._conn.call("POST", self._path("/%d/kill" % pid), body=body)
        return True

    def send_stdin(self, pid, data):
        self._sb._conn.call("POST", self._path("/%d/stdin" % pid), body={"data": data})

    def close_stdin(self, pid):
        self._sb._conn.call("POST", self._path("/%d/stdin" % pid), body={"eof": True})
