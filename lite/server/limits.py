"""What keeps one client from holding or breaking the server, around the app and in the protocol:

- Guard (ASGI, around the Starlette app): a body larger than max_body is refused with 413, from its
  Content-Length before any of it is read, else counted as it streams in; a body that stalls for
  read_timeout is answered 408; any exception that escapes becomes OpenAI's JSON 500 instead of
  uvicorn's plain text and a reset connection; every response carries an x-request-id; and each
  request ends with one access-log line (method, route, status, tokens, ms).
- GuardedH11Protocol (uvicorn's h11 protocol): a connection that sends no complete request head
  within read_timeout is closed (uvicorn times out only the idle time between requests), and the
  open-connection limit answers 503 in OpenAI's JSON (uvicorn's own answer is plain text).
"""
import json
import logging
import time
import uuid

import anyio
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lite.server.openai_protocol import RequestError

log = logging.getLogger("lite.server.access")


async def send_error(send, e, request_id=None):
    """Answer with a RequestError as OpenAI's JSON (closing the connection if it says so)."""
    body = e.body()
    if request_id is not None and e.status >= 500:
        body["error"]["request_id"] = request_id
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if e.close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class Guard:
    def __init__(self, app, max_body, read_timeout):
        self.app, self.max_body, self.read_timeout = app, int(max_body), float(read_timeout)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = "req_" + uuid.uuid4().hex[:24]
        scope["lite.request_id"], scope["lite.usage"] = rid, None
        t0, sent = time.perf_counter(), {}

        async def send_with_id(msg):
            if msg["type"] == "http.response.start":
                sent["status"] = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", ()), (b"x-request-id", rid.encode())]}
            await send(msg)
        try:
            declared = dict(scope["headers"]).get(b"content-length")
            if declared is not None and int(declared) > self.max_body:
                await send_error(send_with_id, self.too_large())
                return
            await self.app(scope, self._reader(receive), send_with_id)
        except Exception as e:              # a bug: the log has the traceback, the client a 500
            if not isinstance(e, RequestError):
                log.error("%s %s failed (request id %s)", scope["method"], scope["path"], rid, exc_info=e)
                e = RequestError(500, f"internal error: {type(e).__name__}: {e}", type="server_error",
                                 close=True)
            if "status" not in sent:
                await send_error(send_with_id, e, rid)
        finally:
            access_line(scope, sent.get("status"), time.perf_counter() - t0)

    def too_large(self):
        return RequestError(413, f"the request body is over the server's limit of {self.max_body} "
                                 f"bytes (lite serve --max-body-mb)", code="body_too_large", close=True)

    def _reader(self, receive):
        """receive, with the body counted against max_body and each wait bounded by read_timeout."""
        state = {"seen": 0, "done": False}

        async def read():
            if state["done"]:               # the body is in: what follows is the disconnect
                return await receive()
            with anyio.move_on_after(self.read_timeout) as scope:
                msg = await receive()
            if scope.cancelled_caught:
                raise RequestError(408, f"the request body did not arrive within "
                                        f"{self.read_timeout:g} s", code="timeout", close=True)
            if msg["type"] == "http.request":
                state["seen"] += len(msg.get("body", b""))
                if state["seen"] > self.max_body:
                    raise self.too_large()
                state["done"] = not msg.get("more_body", False)
            return msg
        return read


def access_line(scope, status, seconds):
    usage = scope.get("lite.usage") or {}
    fields = {"method": scope["method"], "route": scope["path"], "status": status,
              "prompt_tokens": usage.get("prompt_tokens"),
              "completion_tokens": usage.get("completion_tokens"),
              "ms": round(seconds * 1e3, 1), "request_id": scope.get("lite.request_id")}
    tokens = (f" {fields['prompt_tokens']}+{fields['completion_tokens']} tokens" if usage else "")
    log.info("%s %s %s%s %.1f ms", fields["method"], fields["route"], status, tokens, fields["ms"],
             extra={"fields": fields})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head and a JSON connection limit.
    The deadline is uvicorn's timeout_keep_alive (lite serve sets it to --read-timeout)."""

    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self.max_connections, self.limit_concurrency = self.limit_concurrency, None
        self.app = self._limited(self.app)
        self._head_timer = None

    def _limited(self, app):
        async def limited(scope, receive, send):
            if self.max_connections is not None and len(self.connections) > self.max_connections:
                await send_error(send, RequestError(
                    503, f"the server has {len(self.connections)} open connections, over its "
                         f"limit of {self.max_connections}; try again later",
                    type="unavailable_error", code="too_many_connections", close=True))
                return
            await app(scope, receive, send)
        return limited

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data):
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:      # still no whole request head
            self._arm_head_timer()
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc):
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self):
        if self._head_timer is None:        # the deadline runs from the head's first byte
            self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_timeout)

    def _disarm_head_timer(self):
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self):
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
