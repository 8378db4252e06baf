"""A sandbox's files (E2B's files.read/write/list/remove/make_dir,
get_info, exists). Paths are absolute in the sandbox's root."""

from .exceptions import NotFoundException, SandboxException


class EntryInfo(dict):
    """A file: name, path, type ("file", "dir", "symlink", "other"), size,
    mode, permissions, modifiedTime, symlinkTarget; attributes in snake case."""

    def __getattr__(self, name):
        key = {"modified_time": "modifiedTime", "symlink_target": "symlinkTarget"}.get(name, name)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(name) from None


class Files:
    """sandbox.files"""

    def __init__(self, sandbox):
        self._sb = sandbox

    def _path(self, suffix=""):
        from .sandbox import _q
        return "/sandboxes/%s/files%s" % (_q(self._sb.sandbox_id), suffix)

    def read(self, path, format="text", offset=None, length=None):
        """The file's contents: str (format="text", UTF-8) or bytes
        (format="bytes"); offset and length read a part (a file larger than
        the server's max_file_bytes is read in parts)."""
        q = {"path": path, "offset": offset, "length": length}
        with self._sb._conn.open("GET", self._path(), query=q) as resp:
            raw = resp.read()
            size = resp.headers.get("X-File-Size")
        if length is None and offset is None and size is not None and int(size) != len(raw):
            raise SandboxException("read %s: got %d bytes of %s (the file changed, or the read broke off)" % (path, len(raw), size))
        if format == "bytes":
            return raw
        if format != "text":
            raise ValueError('format is "text" or "bytes"')
        return raw.decode()

    def write(self, path, data, mode=None, append=False):
        """Writes data (str: UTF-8, or bytes) as the file, making its missing
        parent directories; mode: permission bits of a new file (0o644)."""
        if isinstance(data, str):
            data = data.encode()
        q = {"path": path, "mode": "%o" % mode if mode is not None else None, "append": "true" if append else None}
        info, _ = self._sb._conn.call("PUT", self._path(), query=q, data=bytes(data))
        return EntryInfo(info)

    def get_info(self, path):
        info, _ = self._sb._conn.call("GET", self._path("/stat"), query={"path": path})
        return EntryInfo(info)

    def exists(self, path):
        try:
            self.get_info(path)
            return True
        except NotFoundException:
            return False

    def list(self, path):
        """The directory's entries by name (every page)."""
        out, token = [], None
        while True:
            page, headers = self._sb._conn.call("GET", self._path("/list"), query={"path": path, "nextToken": token})
            out.extend(EntryInfo(e) for e in page)
            token = headers.get("X-Next-Token")
            if not token:
                return out

    def remove(self, path, recursive=False):
        """Removes a file, a symlink or an empty directory (recursive: a tree)."""
        self._sb._conn.call("DELETE", self._path(), query={"path": path, "recursive": "true" if recursive else None})

    def make_dir(self, path):
        """Makes a directory and its missing parents; False when it existed."""
        out, _ = self._sb._conn.call("POST", self._path("/dir"), query={"path": path})
        return bool(out["created"])
