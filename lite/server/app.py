"""The HTTP layer: a Starlette app speaking the OpenAI API (and Anthropic's Messages API, with the
chat page at /) in front of one Scheduler.

It never touches the engine: it tokenizes, hands a request to the scheduler, and sends on the
events the scheduler emits (from its own thread, through the event loop's thread-safe call).
A client that goes away (an early-closed stream, a dropped connection) cancels its request.
"""
import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from importlib import resources

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from lite.errors import LiteError
from lite.server.anthropic_protocol import api_key_of, error_response, message_routes
from lite.server.grammar import completion_constraint
from lite.server.openai_protocol import (Reply, RequestError, chat_messages, completion_prompt,
                                         context_error, gen_params, model_field, parse_json, sse)
from lite.engine.scheduler import QueueFull, SchedulerStopped, describe, prometheus_text
from lite.server.tool_calls import chat_prompt, message_calls, stream_deltas

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    model_name: str
    api_key: str | None = None
    scheduler: object = None        # set once the model has loaded
    model_names: set = field(default_factory=set)
    webui: bool = True              # the chat page at /
    warned_template: bool = False   # the one warning that the model has no chat template
    created: int = field(default_factory=lambda: int(time.time()))


def _error(e, request=None):
    """A RequestError as OpenAI's JSON; a 5xx names the request id, which the server's log has too."""
    body = e.body()
    if request is not None and e.status >= 500:
        body["error"]["request_id"] = request.scope.get("lite.request_id")
    return JSONResponse(body, status_code=e.status, headers={"connection": "close"} if e.close else None)


def _failed(ev):
    """The error event of a request the scheduler failed, as a RequestError."""
    return RequestError(500, f"the request failed: {ev['error']}", type="server_error")


def _authorized(headers, key):
    """`Authorization: Bearer KEY` (the scheme in any case: RFC 9110 schemes are case-insensitive)
    or Anthropic's `x-api-key: KEY`."""
    given = api_key_of(headers)
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


class EventStream:
    """A server-sent-event response that stops, and calls on_close, when the client goes away."""

    def __init__(self, chunks, on_close):
        self.chunks, self.on_close = chunks, on_close

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        try:
            async with anyio.create_task_group() as tg:
                async def watch():
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()
                tg.start_soon(watch)
                async for data in self.chunks:
                    await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        except OSError:
            pass                        # the connection closed under a send
        finally:
            self.on_close()
            await self.chunks.aclose()


def create_app(state):
    def ready():
        sched = state.scheduler
        if sched is None:
            raise RequestError(503, "the model is loading", type="unavailable_error", code="loading")
        if sched.failure is not None:
            raise RequestError(503, f"the scheduler has stopped: {describe(sched.failure)}; the "
                                    f"server is shutting down", type="unavailable_error",
                               code="scheduler_stopped")
        return sched

    def endpoint(fn, error=_error):
        """Every error of a request becomes an answer in OpenAI's shape: none escapes to Starlette
        (whose 500 is plain text, after which uvicorn drops the keep-alive connection)."""
        async def wrapped(request):
            try:
                # the chat page loads without the key: the user types it into the page
                if state.api_key is not None and request.url.path not in ("/health", "/"):
                    if not _authorized(request.headers, state.api_key):
                        raise RequestError(401, "invalid API key", type="authentication_error",
                                           code="invalid_api_key")
                return await fn(request)
            except RequestError as e:
                return error(e, request)
            except ClientDisconnect:
                return Response(status_code=499)        # nobody is left to read it
            except Exception as e:
                log.error("%s %s failed (request id %s)", request.method, request.url.path,
                          request.scope.get("lite.request_id"), exc_info=e)
                return error(RequestError(500, f"internal error: {describe(e)}",
                                          type="server_error"), request)
        return wrapped

    async def body_of(request):
        body = parse_json(await request.body())
        model = model_field(body)
        if model is not None and model not in state.model_names:
            raise RequestError(404, f"The model `{model}` does not exist", type="not_found_error",
                               param="model", code="model_not_found")
        return body

    async def chat_request(body):
        """An OpenAI chat body -> (prompt ids, Constraint or None, ToolRequest): the messages and
        tools through the model's chat template, the grammar asked for or forcing a tool call."""
        messages = chat_messages(body)
        tok = ready().tokenizer
        if tok.chat_template is None and not state.warned_template:
            state.warned_template = True    # a base model may not follow a built-in template, nor end its turn
            log.warning("%s has no chat template (a base model?): chat requests use a built-in one, "
                        "which it may not follow; /v1/completions suits it", state.model_name)
        try:                            # the contents are text: only the template's markup makes control tokens
            return await run_in_threadpool(chat_prompt, body, messages, tok)
        except LiteError as e:          # a template that fails on these messages
            raise RequestError(400, str(e), param="messages") from None

    async def generate(request, reply, ids, params, stream, chunks=None, error=_error, constraint=None,
                       wrap=None):
        sched = ready()
        if len(ids) >= sched.ctx:
            raise context_error(len(ids), sched.ctx)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def emit(ev):
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:        # the loop has closed: the server is shutting down
                pass
        try:
            seq = sched.submit(ids, params, wrap(emit) if wrap else emit, constraint)
        except QueueFull as e:
            raise RequestError(503, str(e), type="unavailable_error", code="queue_full") from None
        except SchedulerStopped as e:
            raise RequestError(503, str(e), type="unavailable_error", code="scheduler_stopped") from None
        except LiteError as e:
            raise RequestError(400, str(e)) from None
        if stream:
            out = _chunks(reply, events, request.scope) if chunks is None else chunks(reply, events)
            return EventStream(out, lambda: sched.cancel(seq))
        try:
            return await _whole(request, reply, events, error)
        finally:
            sched.cancel(seq)           # a no-op once it finished; frees it when the client left

    @endpoint
    async def chat_completions(request):
        body = await body_of(request)
        params, stream, usage = gen_params(body)
        ids, constraint, tools = await chat_request(body)
        return await generate(request, Reply(True, state.model_name, usage), ids, params, stream,
                              constraint=constraint, wrap=tools.wrap)

    @endpoint
    async def completions(request):
        body = await body_of(request)
        params, stream, usage = gen_params(body)
        prompt = completion_prompt(body)
        sched = ready()
        if isinstance(prompt, str):
            ids = await run_in_threadpool(sched.tokenizer.encode, prompt, True, False)   # text, not control tokens
        else:
            n_vocab = len(sched.tokenizer.tokens)
            if not all(0 <= t < n_vocab for t in prompt):
                raise RequestError(400, f"token ids must be in [0, {n_vocab})", param="prompt")
            ids = prompt
        constraint = await run_in_threadpool(completion_constraint, body, sched.tokenizer)
        return await generate(request, Reply(False, state.model_name, usage), ids, params, stream,
                              constraint=constraint)

    @endpoint
    async def models(request):
        m = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "lite"}
        if state.scheduler is not None:
            m["meta"] = {"n_ctx": state.scheduler.ctx, "n_slots": state.scheduler.n_slots}
        return JSONResponse({"object": "list", "data": [m]})

    @endpoint
    async def health(request):
        if state.scheduler is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.scheduler.failure is not None:
            return JSONResponse({"status": "error", "error": describe(state.scheduler.failure)},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @endpoint
    async def metrics(request):
        return PlainTextResponse(prometheus_text(ready().metrics()),
                                 media_type="text/plain; version=0.0.4")

    @endpoint
    async def tokenize(request):
        body = parse_json(await request.body())
        content, special = body.get("content"), body.get("add_special", False)
        parse = body.get("parse_special", False)
        if not isinstance(content, str):
            raise RequestError(400, "'content' must be a string", param="content")
        for name, value in (("add_special", special), ("parse_special", parse)):
            if not isinstance(value, bool):
                raise RequestError(400, f"'{name}' must be a boolean", param=name)
        ids = await run_in_threadpool(ready().tokenizer.encode, content, special, parse)
        return JSONResponse({"tokens": ids})

    @endpoint
    async def detokenize(request):
        body = parse_json(await request.body())
        ids, tok = body.get("tokens"), ready().tokenizer
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                and 0 <= t < len(tok.tokens) for t in ids):
            raise RequestError(400, "'tokens' must be a list of token ids", param="tokens")
        return JSONResponse({"content": tok.decode(ids)})

    async def http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405)
               else exc.detail)
        shape = error_response if request.url.path.startswith("/v1/messages") else _error
        return shape(RequestError(exc.status_code, msg, type=kind))

    async def webui(request):
        return HTMLResponse(page)

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"]),
              *message_routes(endpoint, body_of, chat_request, generate, state.model_name)]
    if state.webui:
        page = resources.files("lite.server").joinpath("webui/index.html").read_text(encoding="utf-8")
        routes.append(Route("/", webui, methods=["GET"]))
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def _chunks(reply, events, scope):
    """The stream of one request: the role first, text pieces, the final chunk, usage, [DONE].
    The usage goes into the scope too, for the access log."""
    if reply.chat:
        yield reply.chunk(role=True)
    while True:
        ev = await events.get()
        if "text" in ev:
            yield reply.chunk(ev["text"])
        elif "tool_calls" in ev:
            for call in ev["tool_calls"]:
                for delta in stream_deltas(call):
                    yield reply.chunk(tool_calls=delta)
        elif "finish" in ev:
            scope["lite.usage"] = ev["usage"]
            yield reply.chunk(finish_reason=ev["finish"])
            if reply.include_usage:
                yield reply.usage_chunk(ev)
            break
        else:
            body = _failed(ev).body()
            body["error"]["request_id"] = scope.get("lite.request_id")
            yield sse(body)
            break
    yield "data: [DONE]\n\n"


async def _whole(request, reply, events, error=_error):
    """Collect a request's text; stop early (the caller cancels it) if the client disconnects."""
    parts, calls, out = [], [], {}
    async with anyio.create_task_group() as tg:
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        async def collect():
            while True:
                ev = await events.get()
                if "text" in ev:
                    parts.append(ev["text"])
                    continue
                if "tool_calls" in ev:
                    calls.extend(ev["tool_calls"])
                    continue
                out.update(ev)
                break
            tg.cancel_scope.cancel()
        tg.start_soon(watch)
        tg.start_soon(collect)
    if "finish" in out:
        request.scope["lite.usage"] = out["usage"]
        return JSONResponse(reply.whole("".join(parts), out, message_calls(calls)))
    if "error" in out:
        return error(_failed(out), request)
    return PlainTextResponse("", status_code=499)      # the client has gone
