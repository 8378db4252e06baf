"""Python SDK of Cube's cube-api (standard library only).

    from cube_sandbox import Sandbox
    with Sandbox.create(template="docker.io/library/busybox:latest", timeout=300) as sb:
        r = sb.commands.run("echo hello")
        snap = sb.create_snapshot("after-hello")
    again = Sandbox.create(template=snap.snapshot_id)   # restored from the snapshot
    clones = again.clone(3)                             # all or nothing

Environment: CUBE_API_URL (default http://127.0.0.1:3000), CUBE_API_KEY,
CUBE_TEMPLATE_ID. docs/api.md documents the routes.
"""

from .commands import CommandHandle, CommandResult, Commands
from .files import EntryInfo, Files
from .exceptions import (AuthenticationException, CloneException, CommandExitException, ConflictException,
                         InvalidArgumentException, NotFoundException, NotImplementedException,
                         SandboxException, TimeoutException)
from .sandbox import ForkResult, Page, RollbackInfo, Sandbox, SandboxInfo, SnapshotInfo
from .templates import Template, TemplateInfo

__all__ = ["Sandbox", "SandboxInfo", "SnapshotInfo", "RollbackInfo", "ForkResult", "Page", "Template", "TemplateInfo", "Commands", "CommandHandle", "CommandResult", "Files", "EntryInfo",
           "SandboxException", "InvalidArgumentException", "AuthenticationException", "NotFoundException",
           "ConflictException", "NotImplementedException", "TimeoutException", "CommandExitException", "CloneException"]
