"""Errors of the Cube SDK: every error answer of cube-api is a SandboxException
subclass chosen by its HTTP status; a command that exits non-zero raises
CommandExitException."""


class SandboxException(Exception):
    """An error answer of cube-api ({code, message}) or a failed call."""

    def __init__(self, message, status=None, request_id=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.request_id = request_id

    def __str__(self):
        s = self.message
        if self.status:
            s = "%d: %s" % (self.status, s)
        if self.request_id:
            s += " (request %s)" % self.request_id
        return s


class InvalidArgumentException(SandboxException):
    """400 (the message names the field) or 413 (body too large)."""


class AuthenticationException(SandboxException):
    """401: a missing or wrong API key (CUBE_API_KEY)."""


class NotFoundException(SandboxException):
    """404: no such sandbox, snapshot, template or command."""


class ConflictException(SandboxException):
    """409: the state refuses it (busy, in use, already paused, a taken name)."""


class NotImplementedException(SandboxException):
    """501: not implemented by this cube-api yet."""


class TimeoutException(SandboxException):
    """A command outlived its timeout (it was killed) or the server timed out (504)."""


class CommandExitException(SandboxException):
    """A command exited with a non-zero code; its output is kept."""

    def __init__(self, exit_code, stdout, stderr, error=None):
        super().__init__("command exited with code %d: %s" % (exit_code, (stderr or error or "").strip()))
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.error = error


_BY_STATUS = {400: InvalidArgumentException, 413: InvalidArgumentException, 401: AuthenticationException,
              404: NotFoundException, 409: ConflictException, 501: NotImplementedException,
              504: TimeoutException}


def from_status(status, message, request_id=None):
    """The exception for an error answer."""
    return _BY_STATUS.get(status, SandboxException)(message, status=status, request_id=request_id)


class CloneException(SandboxException):
    """clone(n) failed: none of the clones is kept (the ones made were
    killed) and the temporary snapshot is gone. errors: each failure."""

    def __init__(self, errors):
        super().__init__("clone: %d of the sandboxes failed, none is kept: %s"
                         % (len(errors), "; ".join(str(e) for e in errors)))
        self.errors = errors
