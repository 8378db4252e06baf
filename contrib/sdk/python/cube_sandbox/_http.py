"""The HTTP transport: JSON calls and NDJSON streams over urllib, one
connection per request (no pooled keep-alive connections to go stale)."""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

from .exceptions import SandboxException, from_status

ENV_API_URL = "CUBE_API_URL"
ENV_API_KEY = "CUBE_API_KEY"
ENV_TEMPLATE_ID = "CUBE_TEMPLATE_ID"
DEFAULT_API_URL = "http://127.0.0.1:3000"


class ConnectionConfig:
    """Where cube-api is and how to authenticate (arguments win over the
    environment: CUBE_API_URL, CUBE_API_KEY)."""

    def __init__(self, api_url=None, api_key=None, request_timeout=60.0):
        self.api_url = (api_url or os.environ.get(ENV_API_URL) or DEFAULT_API_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(ENV_API_KEY)
        self.request_timeout = request_timeout

    def _request(self, method, path, query=None, body=None, data=None):
        url = self.api_url + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            headers["Content-Type"] = "application/octet-stream"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        return urllib.request.Request(url, data=data, method=method, headers=headers)

    def open(self, method, path, query=None, body=None, timeout=None, data=None):
        """Sends a request (body: JSON; data: raw bytes) and returns the open
        response; an error answer raises."""
        req = self._request(method, path, query, body, data)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.request_timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw)["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.decode(errors="replace").strip() or e.reason
            raise from_status(e.code, msg, e.headers.get("X-Request-Id")) from None
        except urllib.error.URLError as e:
            raise SandboxException("cannot reach cube-api at %s: %s (is it running? CUBE_API_URL names another)"
                                   % (self.api_url, e.reason)) from None

    def drop_connections(self):
        """Drops pooled connections (after a rollback). urllib opens one
        connection per request, so there is none to drop: this is the one
        place to do it should the transport ever keep connections."""
        return None

    def call(self, method, path, query=None, body=None, data=None):
        """A JSON call: returns (decoded answer or None, headers)."""
        with self.open(method, path, query, body, data=data) as resp:
            raw = resp.read()
            return (json.loads(raw) if raw.strip() else None), resp.headers
