"""The HTTP transport: JSON calls and NDJSON streams over urllib, one
connection per request (no pooled keep-alive connections to go stale)."""

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request

from .exceptions import SandboxException, TimeoutException, from_status

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
        response; an error answer raises. No answer within the timeout
        raises TimeoutException, a connection that broke SandboxException
        (both without status: the outcome on the server is unknown)."""
        req = self._request(method, path, query, body, data)
        timeout = timeout or self.request_timeout
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw)["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.decode(errors="replace").strip() or e.reason
            raise from_status(e.code, msg, e.headers.get("X-Request-Id")) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise self._transport_error(method, path, e.reason, timeout) from None
            raise SandboxException("cannot reach cube-api at %s: %s (is it running? CUBE_API_URL names another)"
                                   % (self.api_url, e.reason)) from None
        except (OSError, http.client.HTTPException) as e:
            raise self._transport_error(method, path, e, timeout) from None

    def _transport_error(self, method, path, e, timeout):
        """The exception for a request whose answer did not come (whole):
        urllib and http.client raise socket and protocol errors of their own."""
        if isinstance(e, TimeoutError):
            return TimeoutException("%s %s: no answer from cube-api at %s within %gs (the request_timeout; "
                                    "what the server did is unknown)" % (method, path, self.api_url, timeout))
        return SandboxException("%s %s: the connection to cube-api at %s broke: %s: %s (what the server did is "
                                "unknown)" % (method, path, self.api_url, type(e).__name__, e))

    def drop_connections(self):
        """Drops pooled connections (after a rollback). urllib opens one
        connection per request, so there is none to drop: this is the one
        place to do it should the transport ever keep connections."""
        return None

    def call(self, method, path, query=None, body=None, data=None, timeout=None):
        """A JSON call: returns (decoded answer or None, headers). timeout:
        seconds for this call (default request_timeout)."""
        with self.open(method, path, query, body, timeout=timeout, data=data) as resp:
            try:
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                raise self._transport_error(method, path, e, timeout or self.request_timeout) from None
            return (json.loads(raw) if raw.strip() else None), resp.headers
