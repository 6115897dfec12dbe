"""Start the server: uvicorn serving the app at once (/health says 503 while the model loads),
the engine loaded on a thread, then the scheduler started on it."""
import logging
import threading
from pathlib import Path

from lite.errors import LiteError
from lite.server.app import ServerState, create_app
from lite.server.scheduler import DEFAULT_MAX_QUEUE, Scheduler

log = logging.getLogger(__name__)


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
