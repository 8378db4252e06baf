"""Templates: a sandbox booted from an image, ready, snapshotted by
cube-api; Sandbox.create(template=ID) restores it."""

import urllib.parse

from ._http import ConnectionConfig
from .sandbox import SandboxInfo


class TemplateInfo(SandboxInfo):
    """A template: templateID, snapshotID, image, sizeBytes, createdAt, inUse
    (and buildMs when just built)."""

    def __getattr__(self, name):
        key = {"template_id": "templateID", "snapshot_id": "snapshotID", "size_bytes": "sizeBytes",
               "created_at": "createdAt", "in_use": "inUse", "build_ms": "buildMs"}.get(name, name)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(name) from None


def _q(s):
    return urllib.parse.quote(s, safe="")


class Template:
    """Build, list, get and delete templates."""

    @staticmethod
    def build(image, template_id=None, start_cmd=None, ready_cmd=None, ready_timeout=None, envs=None,
              api_url=None, api_key=None, request_timeout=600.0):
        """Builds a template from image: cube-api boots a sandbox (start_cmd
        as its main process, else its sandbox_command or the image's), runs
        ready_cmd (a list; default ["true"]) until it exits 0 (at most
        ready_timeout seconds, default 60), snapshots it under template_id
        (generated when None) and deletes the build sandbox. NotFoundException
        for an unknown image, ConflictException for a taken id,
        TimeoutException when it is not ready in time."""
        body = {"image": image}
        if template_id:
            body["templateID"] = template_id
        if start_cmd:
            body["startCmd"] = list(start_cmd)
        if ready_cmd:
            body["readyCmd"] = list(ready_cmd)
        if ready_timeout is not None:
            body["readyTimeout"] = int(ready_timeout)
        if envs is not None:
            body["envVars"] = dict(envs)
        info, _ = ConnectionConfig(api_url, api_key, request_timeout).call("POST", "/templates", body=body)
        return TemplateInfo(info)

    @staticmethod
    def list(api_url=None, api_key=None):
        """The templates, oldest first (TemplateInfo)."""
        out, _ = ConnectionConfig(api_url, api_key).call("GET", "/templates")
        return [TemplateInfo(t) for t in out]

    @staticmethod
    def get(template_id, api_url=None, api_key=None):
        info, _ = ConnectionConfig(api_url, api_key).call("GET", "/templates/%s" % _q(template_id))
        return TemplateInfo(info)

    @staticmethod
    def delete(template_id, api_url=None, api_key=None):
        """Deletes a template (ConflictException while a sandbox made from it runs); as in E2B's SDKs, a
        snapshot's id or name is taken too."""
        ConnectionConfig(api_url, api_key).call("DELETE", "/templates/%s" % _q(template_id))
        return True
