"""Sandbox: create, connect, list, kill, pause, resume, set_timeout,
snapshots; names as CubeSandbox's / E2B's SDK."""

import os
import urllib.parse

from ._http import ENV_TEMPLATE_ID, ConnectionConfig
from .commands import Commands
from .files import Files
from .exceptions import CloneException, InvalidArgumentException, NotFoundException, SandboxException, from_status


class _hybrid:
    """A method callable on an instance (sb.kill()) or on the class with a
    sandbox id first (Sandbox.kill(sandbox_id)), as E2B's SDK allows."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        if obj is not None:
            return lambda *a, **kw: self.fn(obj, *a, **kw)

        def on_class(sandbox_id, *a, api_url=None, api_key=None, **kw):
            return self.fn(cls(sandbox_id, ConnectionConfig(api_url, api_key)), *a, **kw)
        return on_class


class SandboxInfo(dict):
    """A sandbox as cube-api shows it (a dict of its JSON: sandboxID,
    templateID, state, startedAt, endAt, timeout, autoPause, metadata),
    with attribute access in snake case."""

    def __getattr__(self, name):
        key = {"sandbox_id": "sandboxID", "template_id": "templateID", "started_at": "startedAt",
               "end_at": "endAt", "auto_pause": "autoPause", "client_id": "clientID"}.get(name, name)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(name) from None


class SnapshotInfo(SandboxInfo):
    """A snapshot: snapshotID, names, sandboxID, kind, parent, sizeBytes,
    createdAt, inUse (and frozenMs, totalMs when just taken)."""

    def __getattr__(self, name):
        key = {"snapshot_id": "snapshotID", "sandbox_id": "sandboxID", "size_bytes": "sizeBytes",
               "created_at": "createdAt", "in_use": "inUse", "frozen_ms": "frozenMs", "total_ms": "totalMs"}.get(name, name)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(name) from None


class RollbackInfo(SnapshotInfo):
    """A rollback's result: sandboxID, snapshotID, memory ("rewrite-dirty"
    or "remap"), frozenMs, totalMs, processes (each pid, action, status,
    command), warnings."""


class ForkResult:
    """One sandbox of a fork: .sandbox (a Sandbox) or .error (a
    SandboxException) when it was not made."""

    def __init__(self, sandbox, error):
        self.sandbox = sandbox
        self.error = error

    def __repr__(self):
        return "ForkResult(%r, %r)" % (self.sandbox, self.error)


class Page(list):
    """One page of a list; next_token is None after the last."""

    def __init__(self, items, next_token):
        super().__init__(items)
        self.next_token = next_token or None


# FORK_REQUEST_TIMEOUT is the least time fork and clone wait for cube-api's
# answer (seconds): it makes the sandboxes one after another, each a VM restore.
FORK_REQUEST_TIMEOUT = 600.0


def _q(s):
    return urllib.parse.quote(s, safe="")


class Sandbox:
    """A sandbox of cube-api. Use as a context manager to kill it on exit:

        with Sandbox.create(template="docker.io/library/busybox:latest") as sb:
            print(sb.commands.run("echo hello").stdout)
    """

    def __init__(self, sandbox_id, conn=None, info=None):
        self.sandbox_id = sandbox_id
        self._conn = conn or ConnectionConfig()
        self.info = SandboxInfo(info or {})
        self.commands = Commands(self)
        self.files = Files(self)

    def __repr__(self):
        return "Sandbox(%r)" % self.sandbox_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.kill()
        except NotFoundException:
            pass
        return False

    @classmethod
    def create(cls, template=None, timeout=None, metadata=None, envs=None, auto_pause=False,
               api_url=None, api_key=None, request_timeout=60.0, allow_internet_access=None, network=None):
        """Creates a sandbox from template: an image reference, a template id
        (Template.build) or a snapshot id or name (the sandbox is restored from
        it: its processes run on from the snapshot); default CUBE_TEMPLATE_ID.
        NotFoundException when it is none of these. timeout: seconds until it
        is killed (or paused with auto_pause); None: the server's default.
        allow_internet_access=False drops what network["allowOut"] does not
        name; network is E2B's {"allowOut": [CIDR...], "denyOut": [...],
        "allowPublicTraffic": bool}."""
        conn = ConnectionConfig(api_url, api_key, request_timeout)
        template = template or os.environ.get(ENV_TEMPLATE_ID)
        if not template:
            raise InvalidArgumentException("no template: pass template= or set CUBE_TEMPLATE_ID")
        body = {"templateID": template, "autoPause": bool(auto_pause)}
        if timeout is not None:
            body["timeout"] = int(timeout)
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if envs is not None:
            body["envVars"] = dict(envs)
        if allow_internet_access is not None:
            body["allow_internet_access"] = bool(allow_internet_access)
        if network is not None:
            body["network"] = dict(network)
        info, _ = conn.call("POST", "/sandboxes", body=body)
        return cls(info["sandboxID"], conn, info)

    @classmethod
    def connect(cls, sandbox_id, timeout=None, api_url=None, api_key=None):
        """A sandbox by id, resumed when paused; its timeout restarts (timeout
        seconds, None: its own)."""
        conn = ConnectionConfig(api_url, api_key)
        body = {"timeout": int(timeout)} if timeout else None
        info, _ = conn.call("POST", "/sandboxes/%s/connect" % _q(sandbox_id), body=body)
        return cls(info["sandboxID"], conn, info)

    @classmethod
    def list(cls, metadata=None, state=None, limit=None, next_token=None, api_url=None, api_key=None):
        """One page of sandboxes (a Page of SandboxInfo; .next_token for the
        next). metadata: pairs that must all match; state: "running",
        "paused" or a list of them."""
        conn = ConnectionConfig(api_url, api_key)
        q = {"limit": limit, "nextToken": next_token}
        if metadata:
            q["metadata"] = urllib.parse.urlencode(metadata)
        if state:
            q["state"] = state if isinstance(state, str) else ",".join(state)
        out, headers = conn.call("GET", "/v2/sandboxes", query=q)
        return Page([SandboxInfo(s) for s in out], headers.get("X-Next-Token"))

    @_hybrid
    def kill(self):
        """Kills the sandbox (its snapshots stay)."""
        self._conn.call("DELETE", "/sandboxes/%s" % _q(self.sandbox_id))
        return True

    @_hybrid
    def get_info(self):
        info, _ = self._conn.call("GET", "/sandboxes/%s" % _q(self.sandbox_id))
        self.info = SandboxInfo(info)
        return self.info

    def is_running(self):
        return self.get_info().state == "running"

    @_hybrid
    def pause(self):
        """Pauses the sandbox (ConflictException when it is not running)."""
        self._conn.call("POST", "/sandboxes/%s/pause" % _q(self.sandbox_id))
        return True

    @_hybrid
    def resume(self, timeout=None):
        """Resumes a paused sandbox; its timeout restarts."""
        body = {"timeout": int(timeout)} if timeout else None
        info, _ = self._conn.call("POST", "/sandboxes/%s/resume" % _q(self.sandbox_id), body=body)
        self.info = SandboxInfo(info)
        return self

    @_hybrid
    def set_timeout(self, timeout):
        """Sets the deadline to now + timeout seconds."""
        self._conn.call("POST", "/sandboxes/%s/timeout" % _q(self.sandbox_id), body={"timeout": int(timeout)})

    @_hybrid
    def set_network(self, allow_internet_access=True, allow_out=None, deny_out=None):
        """Replaces the sandbox's egress policy while it runs (the whole
        policy: say every list again). Returns the policy as applied, with
        "dropped" counters per rule."""
        body = {"allow_internet_access": bool(allow_internet_access)}
        if allow_out:
            body["allowOut"] = list(allow_out)
        if deny_out:
            body["denyOut"] = list(deny_out)
        out, _ = self._conn.call("PUT", "/sandboxes/%s/network" % _q(self.sandbox_id), body=body)
        return out

    def get_host(self, port):
        """The host name under which cube-api forwards requests to the
        sandbox's port (E2B's get_host): "<port>-<sandbox_id>.<domain>", the
        domain being the API URL's host. Send requests to cube-api with this
        Host header, or resolve *.<domain> to cube-api."""
        domain = urllib.parse.urlsplit(self._conn.api_url).netloc
        return "%d-%s.%s" % (int(port), self.sandbox_id, domain)

    @_hybrid
    def create_snapshot(self, name=None):
        """Snapshots the sandbox's whole VM (ConflictException while another
        snapshot of it runs or when the name is taken). Returns SnapshotInfo."""
        body = {"name": name} if name else None
        info, _ = self._conn.call("POST", "/sandboxes/%s/snapshots" % _q(self.sandbox_id), body=body)
        return SnapshotInfo(info)

    @_hybrid
    def rollback(self, snapshot_id):
        """Rolls the sandbox's VM back in place to snapshot_id (an id or a
        name): the same sandbox id, its processes, memory and disk as they
        were at the snapshot. NotFoundException for an unknown snapshot,
        ConflictException while another snapshot or rollback of it runs.
        Connections made before are dropped: every vsock connection of the
        guest was reset, and a kept-alive HTTP connection could be stale."""
        info, _ = self._conn.call("POST", "/sandboxes/%s/rollback" % _q(self.sandbox_id),
                                  body={"snapshotID": snapshot_id})
        self._conn.drop_connections()
        return RollbackInfo(info)

    @_hybrid
    def fork(self, count, timeout=None, all_or_nothing=False, request_timeout=None):
        """Makes count sandboxes (1..100) from this one's state now: its
        processes, memory and disk (server-side: one temporary snapshot,
        always deleted). Returns one ForkResult per sandbox, in order: its
        .sandbox, or its .error (a SandboxException). all_or_nothing: when
        one fails the server deletes the ones it made. request_timeout:
        seconds to wait for the answer (default: the connection's, at least
        FORK_REQUEST_TIMEOUT: cube-api makes the sandboxes one after another);
        past it TimeoutException, and the request ends on the server too."""
        body = {"count": int(count), "allOrNothing": bool(all_or_nothing)}
        if timeout is not None:
            body["timeout"] = int(timeout)
        if request_timeout is None:
            request_timeout = max(self._conn.request_timeout, FORK_REQUEST_TIMEOUT)
        items, _ = self._conn.call("POST", "/sandboxes/%s/fork" % _q(self.sandbox_id), body=body,
                                   timeout=request_timeout)
        out = []
        for it in items:
            if it.get("sandbox"):
                info = it["sandbox"]
                out.append(ForkResult(Sandbox(info["sandboxID"], self._conn, info), None))
            else:
                e = it.get("error") or {}
                out.append(ForkResult(None, from_status(e.get("code") or 500, e.get("message") or "no sandbox and no error")))
        return out

    @_hybrid
    def clone(self, n, concurrency=None, timeout=None, request_timeout=None):
        """Makes n sandboxes from this one's state now, all or nothing: on
        any failure none is kept (the server deletes what it made; any it
        returned is killed here) and CloneException says why. The temporary
        snapshot is the server's and always deleted there, so a crash of
        this client leaks none. concurrency (None: n) is checked (1..n);
        cube-api makes a fork's sandboxes one after another. request_timeout
        as fork's: past it, or when the connection breaks, CloneException
        too (the request's end cancels the fork on the server, which then
        deletes the clones it made: none is kept there either)."""
        n = int(n)
        if n < 1:
            raise InvalidArgumentException("clone: n=%d: want at least 1" % n)
        if concurrency is not None and not 1 <= int(concurrency) <= n:
            raise InvalidArgumentException("clone: concurrency=%s: want 1..%d" % (concurrency, n))
        try:
            results = self.fork(n, timeout=timeout, all_or_nothing=True, request_timeout=request_timeout)
        except SandboxException as e:
            if e.status is not None:
                raise  # an answer: nothing was made (400, 404, 409 …)
            raise CloneException([e]) from None
        made = [r.sandbox for r in results if r.sandbox is not None]
        errors = [r.error for r in results if r.error is not None]
        if not errors and len(made) == n:
            return made
        if not errors:
            errors.append(SandboxException("fork answered %d sandboxes, want %d" % (len(made), n)))
        for sb in made:
            try:
                sb.kill()
            except NotFoundException:
                pass
            except SandboxException as e:
                errors.append(e)
        raise CloneException(errors)

    @staticmethod
    def list_snapshots(sandbox_id=None, limit=None, next_token=None, api_url=None, api_key=None):
        """One page of snapshots, oldest first (a Page of SnapshotInfo)."""
        conn = ConnectionConfig(api_url, api_key)
        out, headers = conn.call("GET", "/snapshots", query={"sandboxID": sandbox_id, "limit": limit,
                                                              "nextToken": next_token})
        return Page([SnapshotInfo(s) for s in out], headers.get("X-Next-Token"))

    @staticmethod
    def get_snapshot(snapshot_id, api_url=None, api_key=None):
        info, _ = ConnectionConfig(api_url, api_key).call("GET", "/snapshots/%s" % _q(snapshot_id))
        return SnapshotInfo(info)

    @staticmethod
    def delete_snapshot(snapshot_id, api_url=None, api_key=None):
        """Deletes a snapshot (ConflictException while it is in use)."""
        ConnectionConfig(api_url, api_key).call("DELETE", "/snapshots/%s" % _q(snapshot_id))
        return True
