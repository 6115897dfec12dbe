"""Starting the server: the port bound first (a busy one is a one-line error before the model loads),
uvicorn serving the app at once (/health says 503 while the model loads), the engine loaded on a
thread, then the scheduler started on it. If the scheduler thread ever dies, the server stops and
serve() raises, so `lite serve` exits non-zero instead of hanging with a dead engine."""
import errno
import json
import logging
import socket
import threading
import time
from pathlib import Path

from lite.errors import LiteError
from lite.engine.scheduler import DEFAULT_MAX_QUEUE, Scheduler, describe

log = logging.getLogger("lite.server")

LOG_FORMATS = ("text", "json")
DEFAULT_MAX_BODY_MB = 4
DEFAULT_READ_TIMEOUT_S = 30
DEFAULT_MAX_CONNECTIONS = 512


class JSONFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and an access line's fields."""

    def format(self, record):
        out = {"time": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "message": record.getMessage()}
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(fmt="text"):
    """The server's own lines (start-up, one a request) at INFO and uvicorn's warnings and errors,
    to stderr, as `lite: LEVEL: message` or as JSON."""
    if fmt not in LOG_FORMATS:
        raise LiteError(f"the log format is text or json, not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json"
                         else logging.Formatter("lite: %(levelname)s: %(message)s"))
    # the scheduler (lite/engine/) reports a request's failure: one of the server's own lines
    for name, level in (("lite.server", logging.INFO), ("lite.engine.scheduler", logging.INFO),
                        ("uvicorn", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False


def bind(host, port):
    """A socket bound to host:port, or a LiteError naming what is wrong."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise LiteError(f"cannot listen on {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise LiteError(f"port {port} is in use") from None
        raise LiteError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def serve(model=None, host="127.0.0.1", port=8080, n_slots=4, api_key=None, alias=None,
          max_queue=DEFAULT_MAX_QUEUE, engine=None, max_body_mb=DEFAULT_MAX_BODY_MB,
          read_timeout=DEFAULT_READ_TIMEOUT_S, max_connections=DEFAULT_MAX_CONNECTIONS,
          log_format="text", webui=True, **engine_kwargs):
    """Serve a model (a known alias or a GGUF path; or a loaded Engine) over the OpenAI and
    Anthropic APIs, with the chat page at / unless webui is False, until interrupted.
    engine_kwargs are Engine's (device, max_context, kv, prefill_chunk, ...)."""
    try:
        import uvicorn
        from lite.server.app import ServerState, create_app
        from lite.server.limits import Guard, GuardedH11Protocol
    except ImportError as e:
        raise LiteError(f"lite serve needs the server extra: pip install 'lite[server]' "
                        f"({e.name} is missing)") from None
    from lite.files.hub import resolve_model
    configure_logging(log_format)
    sock = bind(host, port)                 # before a model is fetched or loaded
    port = sock.getsockname()[1]            # the one the system chose, for --port 0
    try:
        path = engine.gguf.path if engine is not None else resolve_model(model)
    except BaseException:
        sock.close()
        raise
    name = alias or Path(path).stem
    names = {name, Path(path).name, Path(path).stem} | ({model} if isinstance(model, str) else set())
    state = ServerState(name, api_key, model_names=names, webui=webui)
    app = Guard(create_app(state), max_body=int(max_body_mb * 2 ** 20), read_timeout=read_timeout)
    server = uvicorn.Server(uvicorn.Config(
        app, http=GuardedH11Protocol, timeout_keep_alive=read_timeout,
        limit_concurrency=max_connections, log_config=None, access_log=False,
        timeout_graceful_shutdown=2))
    failure = []

    def stop(e):
        failure.append(LiteError(f"the scheduler stopped: {describe(e)}"))
        server.should_exit = True

    def load():
        try:
            from lite.engine.engine import Engine
            t0 = time.perf_counter()
            eng = engine or Engine(path, contiguous_kv=False, **engine_kwargs)
            state.scheduler = Scheduler(eng, n_slots=n_slots, max_queue=max_queue,
                                        on_failure=stop).start()
            log.info("serving %s on http://%s:%d (%d slots, context %d; loaded in %.1f s)", name,
                     host, port, n_slots, eng.max_context, time.perf_counter() - t0)
        except BaseException as e:          # no model, no server: stop and report it
            failure.append(e)
            server.should_exit = True

    loader = threading.Thread(target=load, name="lite-load", daemon=True)
    loader.start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if state.scheduler is not None:
            state.scheduler.stop()
    loader.join(1.0)
    if failure:
        raise failure[0]
