"""The HTTP layer: a Starlette app speaking the OpenAI API in front of one Scheduler.

It never touches the engine: it tokenizes, hands a request to the scheduler, and sends on the
events the scheduler emits (from its own thread, through the event loop's thread-safe call).
A client that goes away (an early-closed stream, a dropped connection) cancels its request.
"""
import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from lite.errors import LiteError
from lite.server.grammar import completion_constraint
from lite.server.openai_protocol import (Reply, RequestError, chat_messages, completion_prompt,
                                         context_error, gen_params, parse_json, sse)
from lite.server.scheduler import DEFAULT_MAX_QUEUE, QueueFull, Scheduler, prometheus_text
from lite.server.tool_calls import chat_prompt, message_calls, stream_deltas

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    model_name: str
    api_key: str | None = None
    scheduler: object = None        # set once the model has loaded
    model_names: set = field(default_factory=set)
    created: int = field(default_factory=lambda: int(time.time()))


def _error(e):
    return JSONResponse(e.body(), status_code=e.status)


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
        if state.scheduler is None:
            raise RequestError(503, "the model is loading", type="unavailable_error", code="loading")
        return state.scheduler

    def endpoint(fn):
        async def wrapped(request):
            try:
                if state.api_key is not None and request.url.path != "/health":
                    if request.headers.get("authorization", "") != f"Bearer {state.api_key}":
                        raise RequestError(401, "invalid API key", type="authentication_error",
                                           code="invalid_api_key")
                return await fn(request)
            except RequestError as e:
                return _error(e)
        return wrapped

    async def body_of(request):
        body = parse_json(await request.body())
        model = body.get("model")
        if model is not None and model not in state.model_names:
            raise RequestError(404, f"The model `{model}` does not exist", type="not_found_error",
                               param="model", code="model_not_found")
        return body

    async def generate(request, reply, ids, params, stream, constraint=None, wrap=None):
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
        except LiteError as e:
            raise RequestError(400, str(e)) from None
        if stream:
            return EventStream(_chunks(reply, events), lambda: sched.cancel(seq))
        try:
            return await _whole(request, reply, events)
        finally:
            sched.cancel(seq)           # a no-op once it finished; frees it when the client left

    @endpoint
    async def chat_completions(request):
        body = await body_of(request)
        params, stream, usage = gen_params(body)
        messages = chat_messages(body)
        sched = ready()
        tok = sched.tokenizer

        try:        # the template, with the tools; the grammar asked for or forcing a tool call
            ids, constraint, tools = await run_in_threadpool(chat_prompt, body, messages, tok)
        except LiteError as e:          # a template that fails on these messages
            raise RequestError(400, str(e), param="messages") from None
        return await generate(request, Reply(True, state.model_name, usage), ids, params, stream,
                              constraint, tools.wrap)

    @endpoint
    async def completions(request):
        body = await body_of(request)
        params, stream, usage = gen_params(body)
        prompt = completion_prompt(body)
        sched = ready()
        if isinstance(prompt, str):
            ids = await run_in_threadpool(sched.tokenizer.encode, prompt)
        else:
            n_vocab = len(sched.tokenizer.tokens)
            if not all(0 <= t < n_vocab for t in prompt):
                raise RequestError(400, f"token ids must be in [0, {n_vocab})", param="prompt")
            ids = prompt
        constraint = await run_in_threadpool(completion_constraint, body, sched.tokenizer)
        return await generate(request, Reply(False, state.model_name, usage), ids, params, stream,
                              constraint)

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
        return JSONResponse({"status": "ok"})

    @endpoint
    async def metrics(request):
        return PlainTextResponse(prometheus_text(ready().metrics()),
                                 media_type="text/plain; version=0.0.4")

    @endpoint
    async def tokenize(request):
        body = parse_json(await request.body())
        content, special = body.get("content"), body.get("add_special", False)
        if not isinstance(content, str):
            raise RequestError(400, "'content' must be a string", param="content")
        ids = await run_in_threadpool(ready().tokenizer.encode, content, bool(special))
        return JSONResponse({"tokens": ids})

    @endpoint
    async def detokenize(request):
        body = parse_json(await request.body())
        ids, tok = body.get("tokens"), ready().tokenizer
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < len(tok.tokens) for t in ids):
            raise RequestError(400, "'tokens' must be a list of token ids", param="tokens")
        return JSONResponse({"content": tok.decode(ids)})

    async def http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405)
               else exc.detail)
        return _error(RequestError(exc.status_code, msg, type=kind))

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def _chunks(reply, events):
    """The stream of one request: the role first, text pieces, the final chunk, usage, [DONE]."""
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
            yield reply.chunk(finish_reason=ev["finish"])
            if reply.include_usage:
                yield reply.usage_chunk(ev)
            break
        else:
            yield sse(RequestError(500, ev["error"], type="server_error").body())
            break
    yield "data: [DONE]\n\n"


async def _whole(request, reply, events):
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
        return JSONResponse(reply.whole("".join(parts), out, message_calls(calls)))
    if "error" in out:
        return _error(RequestError(500, out["error"], type="server_error"))
    return PlainTextResponse("", status_code=499)      # the client has gone


# --- starting it: uvicorn serving the app at once (/health says 503 while the model loads), the
# engine loaded on a thread, then the scheduler started on it ---------------------------------------
def serve(model=None, host="127.0.0.1", port=8080, n_slots=4, api_key=None, alias=None,
          max_queue=DEFAULT_MAX_QUEUE, engine=None, **engine_kwargs):
    """Serve a model (a known alias or a GGUF path; or a loaded Engine) over the OpenAI API until
    interrupted. engine_kwargs are Engine's (device, max_context, kv, prefill_chunk, ...)."""
    try:
        import uvicorn
    except ImportError:
        raise LiteError("lite serve needs the server extra: pip install 'lite[server]'") from None
    from lite.hub import resolve_model
    path = engine.gguf.path if engine is not None else resolve_model(model)
    name = alias or Path(path).stem
    state = ServerState(name, api_key, model_names={name, Path(path).name, Path(path).stem}
                        | ({model} if isinstance(model, str) else set()))
    app = create_app(state)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    failure = []

    def load():
        try:
            from lite.engine import Engine
            eng = engine or Engine(path, contiguous_kv=False, **engine_kwargs)
            state.scheduler = Scheduler(eng, n_slots=n_slots, max_queue=max_queue).start()
            log.warning("serving %s on http://%s:%d (%d slots, context %d)", name, host, port,
                        n_slots, eng.max_context)
        except BaseException as e:          # no model, no server: stop and report it
            failure.append(e)
            server.should_exit = True

    loader = threading.Thread(target=load, name="lite-load", daemon=True)
    loader.start()
    try:
        server.run()
    finally:
        if state.scheduler is not None:
            state.scheduler.stop()
    loader.join(1.0)
    if failure:
        raise failure[0]
